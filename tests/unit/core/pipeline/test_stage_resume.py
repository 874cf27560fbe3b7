"""Resuming with new data: a checkpoint restores into a curriculum with stages appended after its position,
and refuses any change to what it has already read, naming the stage and field (checkpoint/compat.py,
pipeline/resume.py)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from zephon_core import MemorySource, Pipeline, Stage, StagedMixture, StateError, StaticMixture
from zephon_core.pipeline.resume import last_read_chunk


def sources(extra: bool = True):
    rng = np.random.default_rng(3)
    out = [MemorySource([list(range(1 + int(rng.integers(0, 20)))) for _ in range(n)], name=f"s{i}") for i, n in enumerate([40, 25])]
    return out + [MemorySource([[7] * 5] * 30, name="new")] if extra else out


BASE = [Stage({"s0": 1, "s1": 1}, name="warm"), Stage({"s0": 1, "s1": 3}, name="main", start_chunk=6, weight_by="tokens")]


def pipe(ws, shuffle=3, G=2, gid=0):
    p = Pipeline(ws).pack(8)
    if shuffle:
        p = p.shuffle(shuffle)
    return p.batch(2).options(canonical_replicas=4, dp_degree=G, dp_group_id=gid, prefetch=0)


def staged(stages, srcs=None):
    stages = list(stages)
    names = {n for st in stages for n in st.weights}
    return StagedMixture([s for s in (srcs or sources()) if s.name in names], stages, seed=4, chunk_size=12)


def run(ws_factory, n, state=None, shuffle=3):
    """``n`` batches of each of the two groups of dp=2, from ``state``; their digests and the merged state."""
    from zephon_core.verify.simulate import Phase, run_phase

    digests: list[str] = []
    _, merged = run_phase(lambda G, g: pipe(ws_factory(), shuffle, G, g), Phase(2, n), 2, state,
                          on_batch=lambda _g, b: digests.append(b.digest))
    return digests, json.loads(json.dumps(merged))


@pytest.mark.parametrize("shuffle", [None, 3])
def test_a_stage_appended_after_the_checkpoint_resumes_into_the_run_of_the_whole_schedule(shuffle):
    full = [*BASE, Stage({"s1": 1, "new": 2}, name="anneal", start_chunk=60)]
    before, state = run(lambda: staged(BASE), 12, shuffle=shuffle)
    after, _ = run(lambda: staged(full), 30, state, shuffle=shuffle)
    reference, _ = run(lambda: staged(full), 42, shuffle=shuffle)
    assert before + after == reference
    assert max(int(k) + v["cursor"][0] * 4 for k, v in state["lanes"].items()) < 60


def test_a_static_mixture_run_resumes_with_stages_appended():
    static = lambda: StaticMixture(sources(False), [1, 1], seed=4, chunk_size=12)  # noqa: E731
    full = [Stage({"s0": 1, "s1": 1}, name="main"), Stage({"new": 1, "s0": 1}, name="anneal", start_chunk=40)]
    before, state = run(static, 10)
    after, _ = run(lambda: staged(full), 30, state)
    assert before + after == run(lambda: staged(full), 40)[0]
    # The static mixture's one stage must match exactly: other weights are a change from the start.
    with pytest.raises(StateError, match=r"work_source.stages\[0\] \('main'\).weights.s1: 1 vs 2"):
        pipe(staged([Stage({"s0": 1, "s1": 2}, name="main"), full[1]])).restore(state)


def test_a_stage_appended_before_what_the_lanes_have_read_is_refused_with_the_first_chunk_it_may_start_at():
    _, state = run(lambda: staged(BASE), 200)
    full = [*BASE, Stage({"s1": 1, "new": 2}, name="anneal", start_chunk=30)]
    with pytest.raises(StateError) as e:
        pipe(staged(full)).restore(state)
    msg = str(e.value)
    assert "work_source.stages[2] ('anneal') changes the data from global chunk 30" in msg
    assert "work_source.stages[2] ('anneal'): appended, from global chunk 30" in msg
    first_ok = int(re.search(r"must start at global chunk (\d+) or later", msg).group(1))
    assert first_ok > 30
    # Exactly there it is accepted, one chunk earlier refused.
    accepted = pipe(staged([*BASE, Stage({"s1": 1, "new": 2}, name="anneal", start_chunk=first_ok)])).resume_verdict(state)
    assert accepted.accepted, accepted.message
    refused = pipe(staged([*BASE, Stage({"s1": 1, "new": 2}, name="anneal", start_chunk=first_ok - 1)])).resume_verdict(state)
    assert not refused.accepted


@pytest.mark.parametrize(
    "change,field",
    [
        (lambda: [BASE[0], Stage({"s0": 1, "s1": 2}, name="main", start_chunk=6, weight_by="tokens")], r"stages\[1\] \('main'\).weights.s1: 3 vs 2"),
        (lambda: [BASE[0], Stage({"s0": 1, "s1": 3}, name="main", start_chunk=7, weight_by="tokens")], r"stages\[1\] \('main'\).start_chunk: 6 vs 7"),
        (lambda: [BASE[0], Stage({"s0": 1, "s1": 3}, name="main", start_chunk=6)], r"stages\[1\] \('main'\).weight_by: 'tokens' vs 'documents'"),
        (lambda: [BASE[0]], r"stages\[1\] \('main'\): only in the checkpoint's curriculum \(removed\)"),
    ],
)
def test_a_change_to_a_stage_already_read_is_refused_naming_the_stage_and_field(change, field):
    _, state = run(lambda: staged(BASE), 40)
    with pytest.raises(StateError, match="the checkpoint was taken with different data") as e:
        pipe(staged(change())).restore(state)
    assert re.search(field, str(e.value)), str(e.value)


def test_stages_not_yet_started_may_change_or_go():
    planned = [*BASE, Stage({"s1": 1, "new": 2}, name="anneal", start_chunk=500)]
    before, state = run(lambda: staged(planned), 10)
    for later in ([*BASE, Stage({"new": 1}, name="anneal", start_chunk=300)], BASE):
        verdict = pipe(staged(later)).resume_verdict(state)
        assert verdict.accepted, verdict.message
        assert before + run(lambda: staged(later), 5, state)[0] == run(lambda: staged(later), 15)[0]


def test_new_sources_are_appended_never_inserted():
    _, state = run(lambda: staged(BASE), 5)
    inserted = [MemorySource([[7] * 5] * 30, name="new"), *sources(False)]
    full = [*BASE, Stage({"new": 1}, name="anneal", start_chunk=400)]
    with pytest.raises(StateError, match="append new ones after them"):
        pipe(staged(full, inserted)).restore(state)
    pipe(staged(full)).restore(state)


def test_the_seed_or_the_operators_are_never_a_stage_change():
    _, state = run(lambda: staged(BASE), 5)
    other_seed = StagedMixture(sources(False), BASE, seed=5, chunk_size=12)
    with pytest.raises(StateError, match=r"work_source.seed: 4 vs 5"):
        pipe(other_seed).restore(state)
    with pytest.raises(StateError, match=r"ops\[1\].window: 3 vs 4"):
        pipe(staged(BASE), shuffle=4).restore(state)


def test_a_lane_inside_a_shuffle_window_has_read_up_to_the_windows_end():
    ws = staged(BASE)
    p = Pipeline(ws).pack(8).shuffle(40).batch(2).options(canonical_replicas=2, dp_degree=1, dp_group_id=0, prefetch=0)
    it = iter(p)
    for _ in range(5):
        next(it)
    state = p.checkpoint()
    lanes = p._lane_states()
    assert all(ls.cursor.delivered_in_window for ls in lanes.values())  # both lanes mid-window
    reached = {lane: last_read_chunk(lane, ls.cursor, 2, ws, p._chain) for lane, ls in lanes.items()}
    assert all(g > lane + ls.cursor.chunk * 2 for (lane, ls), g in zip(lanes.items(), reached.values()))  # windows reach past the cursors
    last = max(reached.values())
    full = lambda g: staged([*BASE, Stage({"new": 1}, name="anneal", start_chunk=g)])  # noqa: E731
    chain = Pipeline(full(last + 1)).pack(8).shuffle(40).batch(2).options(canonical_replicas=2, dp_degree=1, dp_group_id=0)
    assert chain.resume_verdict(state).accepted
    chain = Pipeline(full(last)).pack(8).shuffle(40).batch(2).options(canonical_replicas=2, dp_degree=1, dp_group_id=0)
    assert not chain.resume_verdict(state).accepted


LONG = MemorySource([[9] * 60] * 20, name="long")  # documents far longer than the first stages'


def windowed(stages, srcs=None):
    p = Pipeline(staged(stages, srcs or [*sources(), LONG])).pack(8).shuffle(40).batch(2)
    return p.options(canonical_replicas=2, dp_degree=1, dp_group_id=0, prefetch=0)


def test_the_first_chunk_a_refusal_names_is_where_the_checkpoints_own_curriculum_filled_its_windows():
    # 45 batches in, both lanes are inside a window of 40 rows. Refilled with the appended stage of long
    # documents from chunk 7, that window ends at chunk 8, and the message used to say 9; a stage at 9 was
    # refused again with 11, and so on. Under the checkpoint's own curriculum it ends at chunk 13.
    first = windowed(BASE)
    it = iter(first)
    before = [next(it).digest for _ in range(45)]
    state, lanes = first.checkpoint(), first._lane_states()
    assert all(ls.cursor.delivered_in_window for ls in lanes.values())
    read = max(last_read_chunk(lane, ls.cursor, 2, first.work_source, first._chain) for lane, ls in lanes.items())
    at = lambda g: windowed([*BASE, Stage({"long": 1}, name="anneal", start_chunk=g)])  # noqa: E731
    refused = at(7).resume_verdict(state)
    assert not refused.accepted
    first_ok = int(re.search(r"must start at global chunk (\d+) or later", refused.message).group(1))
    assert first_ok == read + 1 == 14, refused.message
    assert at(first_ok).resume_verdict(state).accepted
    assert not at(first_ok - 1).resume_verdict(state).accepted
    resumed = at(first_ok)
    resumed.restore(state)
    it = iter(resumed)
    after = [next(it).digest for _ in range(30)]
    whole = iter(at(first_ok))
    assert before + after == [next(whole).digest for _ in range(75)]


def test_a_refusal_that_cannot_rebuild_the_checkpoints_curriculum_names_no_chunk():
    # The planned stage read `long`, which the new recipe drops with it: where the lanes' windows end under
    # the old curriculum cannot be known, and this pipeline's curriculum would give another chunk.
    first = windowed([*BASE, Stage({"long": 1}, name="anneal", start_chunk=12)])
    it = iter(first)
    for _ in range(45):
        next(it)
    verdict = windowed(BASE, sources(False)).resume_verdict(first.checkpoint())
    assert not verdict.accepted
    assert "or later" not in verdict.message
    assert "the checkpoint's lanes have read chunks from global chunk 12 on" in verdict.message, verdict.message
    reason = "source(s) 'long' of the checkpoint's curriculum are not in this pipeline"
    assert f"cannot name the first chunk ({reason})" in verdict.message, verdict.message


def test_a_pad_row_that_closed_before_a_chunks_first_document_has_read_that_chunk():
    # Chunk 0 holds the 4-token document twice: rows [1 2 3] [4 pad pad] [1 2 3] [4 pad pad]. The last row
    # closed because chunk 1's first document did not fit, and the cursor stands at (1, 0, 0). A stage of
    # 1-token documents from chunk 1 would have filled that row, so it must start at chunk 2.
    def pipe(appended_at=None):
        srcs = [MemorySource([[1, 2, 3, 4]], name="early")]
        stages = [Stage({"early": 1}, "early")]
        if appended_at is not None:
            srcs.append(MemorySource([[5]] * 7, name="late"))
            stages.append(Stage({"late": 1}, "late", start_chunk=appended_at))
        p = Pipeline(StagedMixture(srcs, stages, seed=0, chunk_size=2)).pack(2, mode="pad").batch(1)
        return p.options(canonical_replicas=1, dp_degree=1, dp_group_id=0, prefetch=0)

    def take(p, n):
        it = iter(p)
        return [next(it).input_ids.tolist() for _ in range(n)]

    first = pipe()
    before = take(first, 4)
    state = json.loads(json.dumps(first.checkpoint()))
    assert state["lanes"]["0"]["cursor"] == [1, 0, 0, 0]
    assert take(pipe(1), 4) != before  # the row a stage at chunk 1 changes was delivered already
    refused = pipe(1).resume_verdict(state)
    assert not refused.accepted
    assert "read up to global chunk 1 (lane 0)" in refused.message, refused.message
    assert "must start at global chunk 2 or later" in refused.message, refused.message
    resumed = pipe(2)
    resumed.restore(state)
    assert before + take(resumed, 4) == take(pipe(2), 8)


def test_a_lane_inside_a_fit_window_has_read_up_to_the_windows_end():
    ws = staged(BASE)
    p = Pipeline(ws).pack(8, mode="best_fit", window=80).batch(1).options(canonical_replicas=2, dp_degree=1, dp_group_id=0,
                                                                          prefetch=0)
    it = iter(p)
    for _ in range(3):
        next(it)
    state = p.checkpoint()
    lanes = p._lane_states()
    assert all(ls.cursor.token and not ls.cursor.delivered_in_window for ls in lanes.values())  # rows of a fit window out
    reached = {lane: last_read_chunk(lane, ls.cursor, 2, ws, p._chain) for lane, ls in lanes.items()}
    assert all(g > lane + ls.cursor.chunk * 2 for (lane, ls), g in zip(lanes.items(), reached.values()))  # windows reach past the cursors
    last = max(reached.values())
    full = lambda g: staged([*BASE, Stage({"new": 1}, name="anneal", start_chunk=g)])  # noqa: E731
    opts = {"canonical_replicas": 2, "dp_degree": 1, "dp_group_id": 0}
    assert Pipeline(full(last + 1)).pack(8, mode="best_fit", window=80).batch(1).options(**opts).resume_verdict(state).accepted
    assert not Pipeline(full(last)).pack(8, mode="best_fit", window=80).batch(1).options(**opts).resume_verdict(state).accepted
