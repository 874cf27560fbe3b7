"""Loader-state files: written as Megatron writes them, read back safely, refused when wrong."""

from __future__ import annotations

import os

import pytest

from zephon_core import MemorySource, Pipeline, StaticMixture

torch = pytest.importorskip("torch")

from zephon_megatron import state as ls  # noqa: E402
from zephon_megatron.validate import ZephonMegatronError  # noqa: E402

BPS = 4  # micro-batches per step in these tests


def _pipeline(dp=1, rank=0):
    src = MemorySource([[i] * (3 + i % 5) for i in range(200)], name="m")
    return (Pipeline(StaticMixture([src], seed=1, chunk_size=4)).pack(6).batch(2)
            .options(dp_degree=dp, dp_group_id=rank, canonical_replicas=4))


def _state_after(steps: int) -> dict:
    p = _pipeline()
    it = iter(p)
    for _ in range(steps * BPS):
        next(it)
    return p.checkpoint()


def _write(root, iteration, payload, dp_rank=0, pp=False):
    path = ls.state_file(str(root), iteration, dp_rank, pipeline_parallel=pp)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({ls.MEGATRON_KEY: payload}, path)  # what Megatron's maybe_save_dataloader_state does
    return path


def test_state_file_path_matches_megatrons_layout(tmp_path):
    assert ls.state_file("/d", 3, 1, pipeline_parallel=False) == "/d/iter_0000003/mp_rank_00/train_dataloader_dprank001.pt"
    assert ls.state_file("/d", 12, 0, pipeline_parallel=True) == "/d/iter_0000012/mp_rank_00_000/train_dataloader_dprank000.pt"


def test_round_trip_through_torch_save_and_weights_only_load(tmp_path):
    st = _state_after(3)
    payload = ls.encode(st, iteration=3, batches_per_step=BPS)
    assert all(isinstance(v, (int, str)) for v in payload.values())  # plain values, JSON text inside
    path = _write(tmp_path, 3, payload)
    got = ls.read_loader_file(path)
    assert (got.iteration, got.batches_per_step, got.delivered) == (3, BPS, 12)
    assert got.state == st
    assert ls.read_loader_state(path) == st


def test_load_for_iteration_restores_the_pipeline(tmp_path):
    st = _state_after(2)
    _write(tmp_path, 2, ls.encode(st, iteration=2, batches_per_step=BPS))
    got = ls.load_for_iteration(str(tmp_path), 2, 0, batches_per_step=BPS, pipeline_parallel=False)
    p = _pipeline(dp=2, rank=1)
    p.restore(got.state)  # an elastic restore on another DP size
    b = next(iter(p))
    assert b.lane_index == 2


def test_other_ranks_and_layouts_fall_back_to_any_file_of_the_iteration(tmp_path):
    st = _state_after(1)
    _write(tmp_path, 1, ls.encode(st, iteration=1, batches_per_step=BPS), dp_rank=0, pp=True)
    # DP rank 3 of a run without pipeline parallelism finds DP rank 0's file of a PP>1 run.
    path = ls.find_state_file(str(tmp_path), 1, 3, pipeline_parallel=False)
    assert path is not None and path.endswith("mp_rank_00_000/train_dataloader_dprank000.pt")


def test_missing_state_is_refused_naming_what_exists(tmp_path):
    _write(tmp_path, 6, ls.encode(_state_after(6), iteration=6, batches_per_step=BPS))
    with pytest.raises(ZephonMegatronError, match=r"no loader state for iteration 3 .*iterations with a loader state: \[6\]"):
        ls.load_for_iteration(str(tmp_path), 3, 0, batches_per_step=BPS, pipeline_parallel=False)
    with pytest.raises(ZephonMegatronError, match="pass --dataloader-save"):
        ls.load_for_iteration(None, 3, 0, batches_per_step=BPS, pipeline_parallel=False)


def test_a_state_from_another_iteration_is_refused(tmp_path):
    # The iteration-6 file copied where iteration 3's should be.
    _write(tmp_path, 3, ls.encode(_state_after(6), iteration=6, batches_per_step=BPS))
    with pytest.raises(ZephonMegatronError, match="saved at iteration 6, but the model checkpoint is at iteration 3"):
        ls.load_for_iteration(str(tmp_path), 3, 0, batches_per_step=BPS, pipeline_parallel=False)


def test_a_state_whose_progress_does_not_match_its_iteration_is_refused(tmp_path):
    _write(tmp_path, 3, ls.encode(_state_after(2), iteration=3, batches_per_step=BPS))
    with pytest.raises(ZephonMegatronError, match=r"holds 8 delivered micro-batches, but iteration 3 x 4 .* = 12"):
        ls.load_for_iteration(str(tmp_path), 3, 0, batches_per_step=BPS, pipeline_parallel=False)


def test_a_changed_global_batch_is_refused(tmp_path):
    _write(tmp_path, 3, ls.encode(_state_after(3), iteration=3, batches_per_step=BPS))
    with pytest.raises(ZephonMegatronError, match="next step consumes 4 micro-batches .* this run's consumes 8"):
        ls.load_for_iteration(str(tmp_path), 3, 0, batches_per_step=8, pipeline_parallel=False)


def test_the_delivered_count_is_checked_against_megatrons_consumed_samples(tmp_path):
    # A ramped run: 3 steps of 2, 2 and 8 micro-batches (12 in all, micro batch 2 -> 24 samples).
    _write(tmp_path, 3, ls.encode(_state_after(3), iteration=3, batches_per_step=8))
    got = ls.load_for_iteration(str(tmp_path), 3, 0, batches_per_step=8, pipeline_parallel=False, delivered=12,
                                consumed_samples=24)
    assert got.delivered == 12
    with pytest.raises(ZephonMegatronError, match="holds 12 delivered micro-batches, but the model checkpoint's 20 consumed"):
        ls.load_for_iteration(str(tmp_path), 3, 0, batches_per_step=8, pipeline_parallel=False, delivered=10,
                              consumed_samples=20)


class Evil:
    def __reduce__(self):
        return (os.system, ("echo should-never-run",))


@pytest.mark.parametrize(
    "content,needle",
    [
        ({"something": 1}, "expected Megatron's"),
        ({ls.MEGATRON_KEY: {"format": "other"}}, "not a Zephon loader state"),
        ({ls.MEGATRON_KEY: {**ls.encode({}, iteration=1, batches_per_step=1), "state_json": "{"}}, "not valid JSON"),
        ({ls.MEGATRON_KEY: ls.encode({"format": "zephon.state"}, iteration=1, batches_per_step=1)}, "missing field"),
        ({ls.MEGATRON_KEY: {**ls.encode({}, iteration=1, batches_per_step=1), "iteration": -1}}, "non-negative integer"),
    ],
)
def test_malformed_files_are_refused(tmp_path, content, needle):
    path = tmp_path / "x.pt"
    torch.save(content, path)
    with pytest.raises(ZephonMegatronError, match=needle):
        ls.read_loader_file(str(path))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
def test_pickled_objects_are_never_unpickled(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({ls.MEGATRON_KEY: Evil()}, path)
    with pytest.raises(ZephonMegatronError, match=r"a pickled Python object \(posix.system\)"):
        ls.read_loader_file(str(path))
    path.write_bytes(b"\x80\x04not a checkpoint")
    with pytest.raises(ZephonMegatronError, match="can read safely"):
        ls.read_loader_file(str(path))


def test_saved_iterations_lists_iteration_folders(tmp_path):
    for it in (6, 3):
        (tmp_path / f"iter_{it:07d}").mkdir()
    (tmp_path / "latest").mkdir()
    assert ls.saved_iterations(str(tmp_path)) == [3, 6]
    assert ls.saved_iterations(str(tmp_path / "nope")) == []


def test_zephon_inspect_reads_a_megatron_state_file(tmp_path, capsys):
    from zephon_core.cli import main

    path = _write(tmp_path, 3, ls.encode(_state_after(3), iteration=3, batches_per_step=BPS))
    assert main(["inspect", path]) == 0
    assert "canonical_replicas: 4" in capsys.readouterr().out


def test_zephon_report_reads_a_dataloader_save_folder_in_iteration_order(tmp_path):
    from zephon_core.checkpoint.state import parse_lanes
    from zephon_core.cli import build_parser
    from zephon_core.cli.report import request_of
    from zephon_core.metrics import sum_tallies
    from zephon_core.report.load import load_run

    states = {it: _state_after(it) for it in (5, 2)}
    for it, state in states.items():
        for rank in (0, 1):  # every data-parallel rank's file holds the same merged state
            _write(tmp_path, it, ls.encode(state, iteration=it, batches_per_step=BPS), dp_rank=rank)
    run = load_run(request_of(build_parser().parse_args(["report", str(tmp_path), "--batches-per-step", str(BPS)])))
    assert run.history.steps.tolist() == [2, 5] and run.read == "2 checkpoints (iter_0000002 .. iter_0000005)"
    whole = sum_tallies([lane.tally for lane in parse_lanes(states[5]).values()], 1, 1)
    assert run.history.tokens[-1].tolist() == whole.tokens and run.history.batches.tolist() == [2 * BPS, 5 * BPS]
    assert run.curriculum.sizes == [200] and run.curriculum.sizes_from == "the checkpoint"  # in-memory sources record theirs
