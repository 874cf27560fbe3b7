"""The iterators Megatron consumes, the tokenizer adapter, and clearing stale aggregation rounds."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from zephon_core import MemorySource, Pipeline, StaticMixture

pytest.importorskip("torch")

from zephon_megatron import state as ls  # noqa: E402
from zephon_megatron.batches import BatchFormat  # noqa: E402
from zephon_megatron.loader import (  # noqa: E402
    TokenizerAdapter,
    ZephonTrainIterator,
    ZephonValidIterator,
    megatron_tokenizer_identity,
    tokenizer_eod,
)

DOCS = [[10 + d % 50] * (2 + d % 5) + [1] for d in range(300)]


def _pipeline(dp=1, rank=0, **opts):
    return (Pipeline(StaticMixture([MemorySource(DOCS, name="m")], seed=5, chunk_size=4)).pack(8).batch(2)
            .options(dp_degree=dp, dp_group_id=rank, canonical_replicas=4, **opts))


def test_train_iterator_yields_megatron_batches_and_saves_between_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_BATCH_LOG", str(tmp_path / "log-{rank}.txt"))
    it = ZephonTrainIterator(_pipeline(), BatchFormat(eod_id=1), start_iteration=0, num_microbatches=4,
                             batches_per_step=4, saves=True)
    assert iter(it) is it
    mbs = [next(it) for _ in range(8)]
    assert tuple(mbs[0]["tokens"].shape) == (2, 8) and mbs[0].meta is not None
    assert it.iteration == 2
    payload = it.save_state()
    st = ls.decode(payload, "mem")
    assert (st.iteration, st.batches_per_step, st.delivered) == (2, 4, 8)
    lines = (tmp_path / "log-0.txt").read_text().splitlines()
    assert [line.split()[:2] for line in lines] == [[str(m.meta.lane), str(m.meta.lane_index)] for m in mbs]
    next(it)
    with pytest.raises(RuntimeError, match="middle of an optimizer step"):
        it.save_state()


def test_a_resumed_iterator_counts_from_the_resumed_iteration():
    p = _pipeline()
    first = ZephonTrainIterator(p, BatchFormat(), start_iteration=0, num_microbatches=4, batches_per_step=4, saves=True)
    for _ in range(12):
        next(first)
    state = ls.decode(first.save_state(), "mem").state
    q = _pipeline()
    q.restore(state)
    resumed = ZephonTrainIterator(q, BatchFormat(), start_iteration=3, num_microbatches=4, batches_per_step=4, saves=True)
    reference = ZephonTrainIterator(_pipeline(), BatchFormat(), start_iteration=0, num_microbatches=4, batches_per_step=4, saves=True)
    ref = [next(reference) for _ in range(16)][12:]
    got = [next(resumed) for _ in range(4)]
    assert [m.meta for m in got] == [m.meta for m in ref]
    assert resumed.iteration == 4 and ls.decode(resumed.save_state(), "mem").iteration == 4


def test_only_the_coordinating_loader_saves():
    it = ZephonTrainIterator(_pipeline(), BatchFormat(), start_iteration=0, num_microbatches=1, batches_per_step=1, saves=False)
    assert hasattr(it, "save_state")  # Megatron checks for it on every loader before deciding who saves
    with pytest.raises(RuntimeError, match="does not coordinate"):
        it.save_state()


def test_dp_ranks_save_one_merged_state_through_the_aggregate_folder(tmp_path):
    its = [ZephonTrainIterator(_pipeline(2, r, world_size=2, global_rank=r, aggregate_dir=str(tmp_path), run_id="r",
                                         aggregate_timeout_s=30), BatchFormat(), start_iteration=0, num_microbatches=2,
                               batches_per_step=4, saves=True) for r in range(2)]
    for it in its:
        for _ in range(2):
            next(it)
    out = [None, None]

    def save(r):
        out[r] = its[r].save_state()

    threads = [threading.Thread(target=save, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert out[0] == out[1] and ls.decode(out[0], "mem").delivered == 4


def test_validation_iterator_repeats_the_same_batches_every_evaluation():
    made = []

    def make():
        made.append(1)
        return _pipeline()

    it = ZephonValidIterator(make, BatchFormat(), per_evaluation=3)
    first = [next(it)["tokens"].numpy().copy() for _ in range(3)]
    second = [next(it)["tokens"].numpy().copy() for _ in range(3)]
    assert len(made) == 2 and all((a == b).all() for a, b in zip(first, second))
    assert next(it).meta is None  # validation batches are not audited as training batches
    assert it.save_state() is None


def test_validation_iterator_restarts_when_the_held_out_data_ends():
    short = [[5, 6, 1]] * 4

    def make():
        return (Pipeline(StaticMixture([MemorySource(short)], seed=1, chunk_size=2, exhausted="stop")).pack(3).batch(1)
                .options(canonical_replicas=1))

    it = ZephonValidIterator(make, BatchFormat(), per_evaluation=100)
    rows = [next(it)["tokens"].numpy().tolist() for _ in range(10)]
    assert len(rows) == 10


class FakeMegatronTokenizer:
    """The attributes zephon_megatron uses from Megatron's tokenizer objects."""

    def __init__(self, path=None):
        self.path = path

    def tokenize(self, text):
        return [int(x) for x in text.split()]

    @property
    def eod(self):
        return 7

    @property
    def unique_identifiers(self):
        return {"class": "Fake", "tokenizer_path": self.path, "vocab_size": "100"}


def test_tokenizer_adapter_encodes_like_preprocess_data_and_identifies_by_content(tmp_path):
    a, b, c = tmp_path / "a.model", tmp_path / "moved.model", tmp_path / "other.model"
    a.write_bytes(b"model-1")
    b.write_bytes(b"model-1")
    c.write_bytes(b"model-2")
    tok = TokenizerAdapter(FakeMegatronTokenizer(str(a)))
    assert tok.encode("3 4 5") == [3, 4, 5] and tokenizer_eod(FakeMegatronTokenizer()) == 7
    assert megatron_tokenizer_identity(FakeMegatronTokenizer(str(a))) == megatron_tokenizer_identity(FakeMegatronTokenizer(str(b)))
    assert megatron_tokenizer_identity(FakeMegatronTokenizer(str(a))) != megatron_tokenizer_identity(FakeMegatronTokenizer(str(c)))
    p = (Pipeline(StaticMixture([MemorySource(["1 2 3", "4 5"])], seed=1, chunk_size=2)).tokenize(tok, eos_id=7).pack(4)
         .batch(1).options(canonical_replicas=1))
    b0 = next(iter(p))
    assert 7 in np.concatenate([b0.input_ids.ravel(), b0.labels.ravel()])
    assert p.definition()["ops"][0]["tokenizer"] == tok.zephon_identity
