"""The iterators Megatron consumes: training streams (one per loading rank, one reader per model chunk),
the step accounting through batch-size schedules, skipped steps, held-out sets, and the tokenizer adapter."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_core import MemorySource, Pipeline, StaticMixture

pytest.importorskip("torch")

from zephon_megatron import state as ls  # noqa: E402
from zephon_megatron.batches import BatchFormat  # noqa: E402
from zephon_megatron.iterators import TrainStream, ZephonValidIterator, ZephonValidSet, skip_step  # noqa: E402
from zephon_megatron.loader import Place  # noqa: E402
from zephon_megatron.schedule import BatchSchedule, StepCounter  # noqa: E402
from zephon_megatron.tokenizer import TokenizerAdapter, megatron_tokenizer_identity, tokenizer_eod  # noqa: E402

DOCS = [[10 + d % 50] * (2 + d % 5) + [1] for d in range(300)]
MBS = 2


def _pipeline(dp=1, rank=0, **opts):
    return (Pipeline(StaticMixture([MemorySource(DOCS, name="m")], seed=5, chunk_size=4)).pack(8).batch(MBS)
            .options(dp_degree=dp, dp_group_id=rank, canonical_replicas=4, **opts))


def _stream(pipeline=None, *, bps=4, dp=1, schedule=None, saves=True, readers=1):
    schedule = schedule or BatchSchedule.constant(bps * MBS, MBS)
    counter = StepCounter(schedule, dp, iteration=0, consumed_samples=0)
    stream = TrainStream(pipeline or _pipeline(), BatchFormat(eod_id=1), counter, saves=saves)
    return stream, [stream.reader() for _ in range(readers)]


def _resumed(state, *, dp=1, rank=0, schedule, iteration, consumed, readers=1):
    p = _pipeline(dp, rank)
    p.restore(state)
    counter = StepCounter(schedule, dp, iteration=iteration, consumed_samples=consumed)
    stream = TrainStream(p, BatchFormat(eod_id=1), counter, saves=True)
    return stream, [stream.reader() for _ in range(readers)]


def test_train_iterator_yields_megatron_batches_and_saves_between_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_BATCH_LOG", str(tmp_path / "log-{rank}.txt"))
    stream, (it,) = _stream(bps=4)
    assert iter(it) is it
    mbs = [next(it) for _ in range(8)]
    assert tuple(mbs[0]["tokens"].shape) == (MBS, 8) and mbs[0].meta is not None
    assert it.iteration == 2
    st = ls.decode(it.save_state(), "mem")
    assert (st.iteration, st.batches_per_step, st.delivered) == (2, 4, 8)
    lines = (tmp_path / "log-0.txt").read_text().splitlines()
    assert [line.split()[:2] for line in lines] == [[str(m.meta.lane), str(m.meta.lane_index)] for m in mbs]
    next(it)
    with pytest.raises(RuntimeError, match=r"middle of optimizer step 3 \(1 of its 4 micro-batches"):
        it.save_state()


def test_a_resumed_stream_counts_from_the_resumed_iteration():
    schedule = BatchSchedule.constant(4 * MBS, MBS)
    _, (first,) = _stream(bps=4)
    for _ in range(12):
        next(first)
    state = ls.decode(first.save_state(), "mem").state
    _, (resumed,) = _resumed(state, schedule=schedule, iteration=3, consumed=3 * 4 * MBS)
    _, (reference,) = _stream(bps=4)
    ref = [next(reference) for _ in range(16)][12:]
    got = [next(resumed) for _ in range(4)]
    assert [m.meta for m in got] == [m.meta for m in ref]
    assert resumed.iteration == 4 and ls.decode(resumed.save_state(), "mem").iteration == 4


def test_pipelines_that_do_not_coordinate_hand_megatron_no_state_but_still_check_the_step():
    # Context-parallel rank 1 of the first stage: Megatron asks it too, and writes nothing for None.
    _, (it,) = _stream(bps=2, saves=False)
    next(it)
    with pytest.raises(RuntimeError, match="middle of optimizer step 1"):
        it.save_state()
    next(it)
    assert it.save_state() is None


def test_exactly_one_pipeline_per_data_parallel_rank_saves():
    def place(tp=0, cp=0, first=True, last=False):
        return Place(tp_rank=tp, cp_rank=cp, dp=2, dp_rank=0, pp=2, first=first, last=last, all_stages=False)

    assert place().loads and place().saves
    assert place(cp=1).loads and not place(cp=1).saves  # context-parallel peers read the same stream
    assert place(first=False, last=True).loads and not place(first=False, last=True).saves
    assert not place(tp=1).loads and not place(tp=1, cp=1).saves
    assert not place(first=False).loads  # a middle stage
    assert Place(0, 1, 2, 0, 4, False, False, all_stages=True).loads


def test_dp_ranks_save_one_merged_state_through_the_aggregate_folder(tmp_path):
    its = []
    for r in range(2):
        p = _pipeline(2, r, world_size=2, global_rank=r, aggregate_dir=str(tmp_path), run_id="r", aggregate_timeout_s=30)
        its.append(_stream(p, bps=4, dp=2)[1][0])
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


def test_model_chunks_of_one_rank_read_one_stream_in_their_own_order():
    # Virtual pipelines with every chunk reading (e.g. --dataloader-inter-document-masking): the
    # interleaved schedule runs chunk 0 ahead of chunk 1; both see the same micro-batches.
    stream, (c0, c1) = _stream(bps=4, readers=2)
    a = [next(c0) for _ in range(3)]
    b = [next(c1) for _ in range(2)]
    a.append(next(c0))
    b.append(next(c1))
    with pytest.raises(RuntimeError, match=r"model chunks at \[3, 4\]"):
        stream.save_state()
    b.append(next(c1))
    assert [m.meta for m in a] == [m.meta for m in b] and len({m.meta.digest for m in a}) == 4
    assert a[0] is not b[0]  # each chunk gets a dict of its own (Megatron's get_batch edits it)
    assert ls.decode(c1.save_state(), "mem").iteration == 1 and len(stream._buffer) == 0


def test_virtual_pipeline_chunks_resume_exactly_from_one_saved_state():
    schedule = BatchSchedule.constant(4 * MBS, MBS)
    _, (ref0, _ref1) = _stream(bps=4, readers=2)
    reference = [next(ref0).meta for _ in range(24)]
    _, (c0, c1) = _stream(bps=4, readers=2)
    for _ in range(8):
        next(c0), next(c1)
    state = ls.decode(c0.save_state(), "mem").state
    _, (r0, r1) = _resumed(state, schedule=schedule, iteration=2, consumed=16, readers=2)
    got0 = [next(r0).meta for _ in range(16)]
    got1 = [next(r1).meta for _ in range(16)]
    assert got0 == got1 == reference[8:]


def _step_schedule(text):
    nmc = pytest.importorskip("megatron.core.num_microbatches_calculator")
    calc = nmc.StepBatchsizeNumMicroBatchesCalculator(micro_batch_size=MBS, data_parallel_size=1,
                                                      decrease_batch_size_if_needed=False, rank=1, schedule=text)
    return BatchSchedule.from_calculator(calc, MBS), calc


def test_the_schedule_follows_megatrons_own_calculator_without_touching_it():
    schedule, calc = _step_schedule("0:8 16:16 48:24")
    before = calc.get_current_global_batch_size()
    assert [schedule.global_batch(c) for c in (0, 8, 16, 40, 48, 10**9)] == [8, 8, 16, 16, 24, 24]
    assert calc.get_current_global_batch_size() == before
    assert [(s.first, s.last, s.global_batch) for s in schedule.segments(9)] == [(1, 2, 8), (3, 4, 16), (5, 9, 24)]
    assert schedule.first_break(8, 9) is None
    assert (schedule.first_break(16, 9).first, schedule.first_break(16, 9).global_batch) == (1, 8)
    assert [(s.first, s.last) for s in BatchSchedule.constant(8, MBS).segments(None)] == [(1, 10**7)]


def _steps(readers_by_rank, counters, n_steps):
    """Per step: the set of (lane, lane_index, digest) that all ranks read in it."""
    out = []
    for _ in range(n_steps):
        step = set()
        for reader, counter in zip(readers_by_rank, counters):
            for _ in range(counter.step_size):
                m = next(reader).meta
                step.add((m.lane, m.lane_index, m.digest))
        out.append(step)
    return out


def test_a_resume_mid_ramp_on_another_dp_size_keeps_every_step():
    schedule, _ = _step_schedule("0:8 16:16 48:24")
    ref_stream, (ref,) = _stream(schedule=schedule)
    reference = _steps([ref], [ref_stream.counter], 6)
    assert [len(s) for s in reference] == [4, 4, 8, 8, 12, 12]
    # Two steps at DP=1, saved at step 3 in the middle of the ramp, resumed on DP=2.
    first_stream, (first,) = _stream(schedule=schedule)
    assert _steps([first], [first_stream.counter], 3) == reference[:3]
    st = ls.decode(first.save_state(), "mem")
    assert (st.iteration, st.delivered, st.batches_per_step) == (3, 16, 8)
    ranks = [_resumed(st.state, dp=2, rank=r, schedule=schedule, iteration=3, consumed=32) for r in range(2)]
    got = _steps([r[1][0] for r in ranks], [r[0].counter for r in ranks], 3)
    assert got == reference[3:]


def test_a_skipped_step_consumes_exactly_its_micro_batches():
    stream, (it,) = _stream(bps=4)
    skip_step(it, 4)
    skip_step([None, None], 4)  # model chunks of this rank that read nothing
    assert it.iteration == 1 and stream.counter.at_boundary
    _, (reference,) = _stream(bps=4)
    assert next(it).meta == [next(reference) for _ in range(5)][4].meta


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


def _held_out(n_docs):
    docs = [[5 + d % 7] * (3 + d % 4) + [1] for d in range(n_docs)]
    return lambda: (Pipeline(StaticMixture([MemorySource(docs)], seed=1, chunk_size=2, exhausted="stop")).pack(6).batch(2)
                    .options(canonical_replicas=1))


def test_validation_iterator_restarts_when_the_held_out_data_ends():
    it = ZephonValidIterator(_held_out(4), BatchFormat(), per_evaluation=100)
    rows = [next(it)["tokens"].numpy().tolist() for _ in range(10)]
    assert len(rows) == 10


def test_a_full_validation_set_reads_its_recipe_to_the_end_and_pads_without_loss():
    make = _held_out(20)
    n = sum(1 for _ in make())
    target = {"iters": None}
    vs = ZephonValidSet(make, BatchFormat(), per_iteration=2, eval_iters=lambda: target["iters"], name="h.toml")
    assert len(vs) == -(-n // 2)
    target["iters"] = len(vs) + 1  # another data-parallel rank needs one more evaluation iteration
    passes = [list(vs), list(vs)]
    for p in passes:
        assert len(p) == target["iters"] * 2
        assert all(m["loss_mask"].sum() > 0 for m in p[:n]) and all(m["loss_mask"].sum() == 0 for m in p[n:])
    assert all((a["tokens"] == b["tokens"]).all() for a, b in zip(*passes))
    assert vs.save_state() is None


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


def _schedule_of(sizes):
    """A batch-size schedule as Megatron's calculators give one: the step's size from the samples consumed before it."""
    starts = np.cumsum([0] + [n * MBS for n in sizes[:-1]])

    def gbs(consumed):
        return sizes[int(np.searchsorted(starts, consumed, side="right")) - 1] * MBS

    return BatchSchedule(gbs, MBS, horizon=None)


def _run_phase(schedule, dp, C, n_steps, *, state=None, iteration=0, consumed=0):
    from zephon_core.checkpoint.merge import merge_states

    streams = []
    for g in range(dp):
        p = (Pipeline(StaticMixture([MemorySource(DOCS, name="m")], seed=5, chunk_size=4)).pack(8).batch(MBS)
             .options(dp_degree=dp, dp_group_id=g, canonical_replicas=C))
        if state is not None:
            p.restore(state)
        streams.append(TrainStream(p, BatchFormat(), StepCounter(schedule, dp, iteration=iteration, consumed_samples=consumed),
                                   saves=False))
    readers = [s.reader() for s in streams]
    steps = _steps(readers, [s.counter for s in streams], n_steps)
    assert all(s.counter.at_boundary and s.counter.iteration == iteration + n_steps for s in streams)
    merged = merge_states([s.pipeline.checkpoint() for s in streams])
    return steps, merged, streams[0].counter.consumed_samples


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(C=st.sampled_from([2, 4]), per_lane=st.lists(st.integers(1, 3), min_size=2, max_size=5), data=st.data())
def test_every_step_keeps_its_samples_through_any_batch_schedule_and_resize(C, per_lane, data):
    """The elastic guarantee through a ramp: per-step content is the same on any DP size, resumed at any step."""
    sizes = [k * C for k in per_lane]  # micro-batches per step: every size a multiple of the lanes
    schedule = _schedule_of(sizes)
    divisors = [d for d in (1, 2, 4) if C % d == 0]
    cut = data.draw(st.integers(1, len(sizes) - 1), label="resume after step")
    dp_a, dp_b = data.draw(st.sampled_from(divisors), label="dp before"), data.draw(st.sampled_from(divisors), label="dp after")
    reference, _, _ = _run_phase(schedule, 1, C, len(sizes))
    before, state, consumed = _run_phase(schedule, dp_a, C, cut)
    assert consumed == sum(sizes[:cut]) * MBS
    after, _, _ = _run_phase(schedule, dp_b, C, len(sizes) - cut, state=state, iteration=cut, consumed=consumed)
    assert before + after == reference
    assert [len(s) for s in reference] == sizes
