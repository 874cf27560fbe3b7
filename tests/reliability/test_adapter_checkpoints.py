"""The adapters' checkpoint slots: TorchTitan DCP folders and Megatron loader-state files.

A checkpoint without Zephon's loader state, with a damaged slot or with a
pickle in the slot is refused with a clear error (nothing is unpickled); an
empty state dict is a no-op; a Megatron loader state newer than the model
checkpoint is never used. Where a run resumes, 0 samples are lost or
duplicated.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import relkit
from relkit import C, M, by_step, compare, reference

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
core = pytest.importorskip("zephon_torchtitan.core")
tt_state = pytest.importorskip("zephon_torchtitan.state")

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]


class Payload:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture
def recipe(tmp_path) -> str:
    """A pretokenized recipe (no tokenizer needed), with the corpus of relkit."""
    docs = [relkit._doc(d) for d in range(relkit.N_DOCS)]
    np.save(tmp_path / "tokens.npy", np.concatenate([np.asarray(d, dtype=np.int64) for d in docs]))
    np.save(tmp_path / "offsets.npy", np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64))
    path = tmp_path / "data.toml"
    path.write_text(
        f'seed = 7\nchunk_size = 6\ncanonical_replicas = {C}\n'
        '[[sources]]\npath = "tokens.npy"\nformat = "token_array"\noffsets = "offsets.npy"\n'
    )
    return str(path)


def stream(recipe: str, G: int = 1, g: int = 0):
    return core.ZephonStream(core.Settings(recipe=recipe), dp_world_size=G, dp_rank=g, tokenizer=None, seq_len=relkit.SEQ_LEN,
                             local_batch_size=relkit.BATCH, batches_per_step=C * M)


def records(s, n: int) -> list:
    """The next ``n`` batches of a stream, as relkit records (through its pipeline)."""
    if s._iter is None:
        s._iter = iter(s.pipeline)
    return [relkit.batch_record(next(s._iter)) for _ in range(n)]


def _save_dcp(folder: Path, state: dict) -> None:
    dcp.save(state, checkpoint_id=str(folder), no_dist=True)


def test_dcp_folder_without_loader_state(tmp_path, rel, recipe):
    folder = tmp_path / "step-10"
    _save_dcp(folder, {"model.w": torch.ones(4), "optimizer.lr": torch.tensor(0.1)})
    with pytest.raises(ValueError) as e:
        tt_state.read_dcp_state(str(folder))
    assert str(folder) in str(e.value) and "no Zephon loader state" in str(e.value)
    with pytest.raises(ValueError) as e:
        tt_state.read_dcp_state(str(tmp_path))  # not a checkpoint folder at all
    assert "no .metadata" in str(e.value)
    s = stream(recipe)
    with pytest.raises(ValueError) as e:
        s.load_state_dict({"sampler": torch.zeros(3)})
    assert "zephon_state" in str(e.value) and "sampler" in str(e.value)
    # {} (TorchTitan's "no loader state to restore") is a no-op: a fresh start
    s.load_state_dict({})
    fresh = stream(recipe)
    assert records(s, 6) == records(fresh, 6)
    rel.case("DCP folder without the loader key; load_state_dict without it / with {}", "clear error / no-op", samples=6 * relkit.BATCH)


def test_damaged_dcp_slots_are_refused(tmp_path, rel, recipe):
    good = core.encode_state(stream(recipe).pipeline.checkpoint(), 4096).numpy()
    n = int.from_bytes(good[:8].tobytes(), "little")
    cases = {
        "zeros": np.zeros(4096, np.uint8),
        "shorter than the length field": good[:5],
        "length beyond the slot": np.concatenate([np.frombuffer((10**9).to_bytes(8, "little"), np.uint8), good[8:]]),
        "JSON cut short": np.concatenate([good[:8], good[8 : 8 + n // 2], np.zeros(4096 - 8 - n // 2, np.uint8)]),
        "not UTF-8": np.concatenate([good[:8], np.full(n, 0xFF, np.uint8), good[8 + n :]]),
    }
    data = json.dumps([1, 2]).encode()
    arr = np.zeros(4096, np.uint8)
    arr[:8] = np.frombuffer(len(data).to_bytes(8, "little"), np.uint8)
    arr[8 : 8 + len(data)] = np.frombuffer(data, np.uint8)
    cases["a JSON list"] = arr
    for name, value in cases.items():
        with pytest.raises(ValueError) as e:
            core.decode_state(torch.from_numpy(np.ascontiguousarray(value)))
        assert "zephon" in str(e.value) and "loader state" in str(e.value), (name, str(e.value))
        rel.case(f"DCP slot: {name}", "ValueError naming the loader state")
    # a well-formed slot with a damaged state inside: restore names the field
    st = stream(recipe).pipeline.checkpoint()
    st["lanes"]["1"]["delivered"] = "many"
    with pytest.raises(ValueError) as e:
        stream(recipe).load_state_dict({core.STATE_KEY: core.encode_state(st, 4096)})
    assert "lanes['1'].delivered" in str(e.value)
    rel.case("DCP slot: well-formed slot, mistyped field inside", "StateError naming the field")


def test_dcp_slot_holding_a_pickle_is_never_unpickled(tmp_path, rel):
    marker = tmp_path / "MARKER-dcp"
    folder = tmp_path / "step-20"
    _save_dcp(folder, {"model.w": torch.ones(2), tt_state.DCP_KEY: Payload(str(marker))})
    assert not marker.exists()  # saving pickles; loading must not unpickle
    with pytest.raises(ValueError) as e:
        tt_state.read_dcp_state(str(folder))
    assert "refusing to unpickle" in str(e.value)
    assert not marker.exists()
    rel.case("DCP slot holding a pickled object", "refused, never unpickled")


def test_dcp_roundtrip_resumes_on_another_topology_without_loss(tmp_path, rel, recipe):
    first = stream(recipe)
    before = records(first, 3 * C * M)
    folder = tmp_path / "step-3"
    _save_dcp(folder, {"model.w": torch.ones(2), **{f"dataloader.{k}": v for k, v in first.state_dict().items()}})
    state = tt_state.read_dcp_state(str(folder))
    after = []
    for g in range(2):  # resume on two data-parallel ranks
        s = stream(recipe, G=2, g=g)
        s.load_state_dict({core.STATE_KEY: core.encode_state(state, core.DEFAULT_STATE_CAPACITY)})
        after += records(s, 2 * C * M // 2)
    checked, lost, dup = compare(by_step(before + after), reference(5))
    rel.case("DCP save / read_dcp_state / resume on 2 ranks", "resumed", samples=checked, lost=lost, duplicated=dup)
    assert (lost, dup) == (0, 0)


# -- Megatron ------------------------------------------------------------------------------
mg_state = pytest.importorskip("zephon_megatron.state")


def _save_loader_state(root: Path, iteration: int, state: dict, bps: int, claimed: int | None = None) -> str:
    path = mg_state.state_file(str(root), iteration, 0, pipeline_parallel=False)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    payload = mg_state.encode(state, iteration=iteration if claimed is None else claimed, batches_per_step=bps)
    torch.save({mg_state.MEGATRON_KEY: payload}, path)
    return path


def _progress(steps: int) -> tuple[dict, list]:
    p = relkit.pipeline(prefetch=0)
    it = iter(p)
    rows = [relkit.batch_record(next(it)) for _ in range(steps * C * M)]
    st = json.loads(json.dumps(p.checkpoint()))
    p.close()
    return st, rows


def test_megatron_loader_state_newer_than_the_model_checkpoint_is_ignored(tmp_path, rel):
    """Megatron writes the loader state before the model checkpoint is
    committed, so a crash can leave iter_0000004's loader state next to a
    model checkpoint of iteration 2: resuming at 2 must use iteration 2's."""
    bps = C * M
    st2, rows2 = _progress(2)
    st4, _ = _progress(4)
    root = tmp_path / "dataloader"
    _save_loader_state(root, 2, st2, bps)
    _save_loader_state(root, 4, st4, bps)  # orphan: its model checkpoint never completed
    got = mg_state.load_for_iteration(str(root), 2, 0, batches_per_step=bps, pipeline_parallel=False)
    assert got.iteration == 2 and got.state == st2
    p = relkit.pipeline(prefetch=0)
    p.restore(got.state)
    it = iter(p)
    after = [relkit.batch_record(next(it)) for _ in range(2 * C * M)]
    p.close()
    checked, lost, dup = compare(by_step(rows2 + after), reference(4))
    rel.case("Megatron: loader state of iteration 4 next to a model checkpoint of 2", "iteration 2's used", samples=checked, lost=lost, duplicated=dup)
    assert (lost, dup) == (0, 0)
    # only the newer one: refused, naming what exists
    only_new = tmp_path / "only-new"
    _save_loader_state(only_new, 4, st4, bps)
    with pytest.raises(Exception) as e:
        mg_state.load_for_iteration(str(only_new), 2, 0, batches_per_step=bps, pipeline_parallel=False)
    assert "iteration 2" in str(e.value) and "[4]" in str(e.value), str(e.value)
    # a file in iteration 2's folder that holds iteration 4's progress
    mixed = tmp_path / "mixed"
    _save_loader_state(mixed, 2, st4, bps, claimed=4)
    with pytest.raises(Exception) as e:
        mg_state.load_for_iteration(str(mixed), 2, 0, batches_per_step=bps, pipeline_parallel=False)
    assert "iteration 4" in str(e.value) and "iteration 2" in str(e.value), str(e.value)
    mixed2 = tmp_path / "mixed2"
    _save_loader_state(mixed2, 2, st4, bps)  # claims 2, holds 4 steps of progress
    with pytest.raises(Exception) as e:
        mg_state.load_for_iteration(str(mixed2), 2, 0, batches_per_step=bps, pipeline_parallel=False)
    assert "delivered" in str(e.value), str(e.value)
    rel.case("Megatron: only a newer state / a state claiming another iteration", "clear error")


def test_megatron_loader_file_holding_a_pickle_is_never_unpickled(tmp_path, rel):
    marker = tmp_path / "MARKER-megatron"
    path = mg_state.state_file(str(tmp_path / "dl"), 2, 0, pipeline_parallel=False)
    os.makedirs(os.path.dirname(path))
    torch.save({mg_state.MEGATRON_KEY: Payload(str(marker))}, path)
    with pytest.raises(Exception) as e:
        mg_state.read_loader_file(path)
    assert path in str(e.value) and "weights_only" in str(e.value)
    assert not marker.exists()
    rel.case("Megatron loader-state .pt holding a pickled object", "refused, never unpickled")
