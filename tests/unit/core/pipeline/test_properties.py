"""Property-based tests (hypothesis) of Zephon's data contract.

Random recipes (1-3 in-memory token sources with random weights, seed,
chunk_size, seq_len, pack mode, optional shuffle window, batch size), random
``canonical_replicas`` C and random topology changes must give:

1. elastic equivalence: per global step the same multiset of rows as an
   uninterrupted run, and over the whole run no row lost or repeated;
2. checkpoint at any batch + restore continues byte-identically;
3. execution knobs (parallelism, runner, prefetch, readahead, reader
   threads) never change the data;
4. restore cost does not grow with the position restored to;
5. a mid-step checkpoint resumed on another topology loses and repeats no row;
6. staged curricula (random schedules of 1-3 stages over random subsets of the
   sources, weighted by documents or tokens): 1 and 2 hold; a checkpoint taken
   under the first stages and resumed with the rest appended gives exactly the
   run of the whole schedule from the start, on any DP sequence, or is refused
   naming the stage; a refusal names the first chunk a stage may start at
   (there it is accepted and continues the whole schedule, one chunk earlier
   refused), also from inside a shuffle window; no document is repeated within
   a source epoch or skipped across a stage change; token-weighted stages give
   each source its token quota per chunk to within one document.

``ZEPHON_SOAK=1`` raises the number of examples for an opt-in long run.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from typing import Any

import numpy as np  # noqa: E402
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from support.property_strategies import (  # noqa: E402
    CANONICAL_REPLICAS,
    CountingMemorySource,
    Recipe,
    StagedRecipe,
    WindowResume,
    batch_key,
    divisors,
    recipes,
    row_counter,
    staged_recipes,
    text_recipes,
    window_resumes,
)

from zephon_core import Pipeline, StateError  # noqa: E402
from zephon_core.verify.curriculum_audit import audit_curriculum  # noqa: E402
from zephon_core.verify.simulate import Phase, StepRecord, first_mismatch, run_phase, run_schedule  # noqa: E402

SOAK = os.environ.get("ZEPHON_SOAK", "") not in ("", "0")


def examples(n: int) -> settings:
    return settings(
        max_examples=n * 40 if SOAK else n,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )


def knobs() -> st.SearchStrategy[dict[str, int]]:
    return st.fixed_dictionaries(
        {"prefetch": st.sampled_from([0, 1, 8]), "readahead": st.sampled_from([0, 3]), "reader_threads": st.sampled_from([0, 2])}
    )


def take(p: Pipeline, n: int) -> list[Any]:
    it = iter(p)
    return [next(it) for _ in range(n)]


def take_upto(p: Pipeline, n: int) -> list[Any]:
    """Up to ``n`` batches: fewer when a finite curriculum ends."""
    it = iter(p)
    out: list[Any] = []
    while len(out) < n:
        b = next(it, None)
        if b is None:
            break
        out.append(b)
    return out


def all_segments(records: list[StepRecord]) -> Counter[Any]:
    return Counter(seg for r in records for seg in r.segments)


def all_rows(records: list[StepRecord]) -> Counter[Any]:
    return Counter(row for r in records for row in zip(r.digests, r.segments))


def delivered_per_lane(state: dict[str, Any]) -> dict[int, int]:
    return {int(k): v["delivered"] for k, v in state["lanes"].items()}


class Maker:
    """A ``(dp_degree, dp_group_id) -> Pipeline`` factory over shared sources."""

    def __init__(self, recipe: Any, C: int, knob: dict[str, int] | None = None) -> None:
        self.recipe, self.C, self.knob = recipe, C, knob or {}
        self.sources = recipe.sources()

    def __call__(self, G: int, gid: int, **extra: Any) -> Pipeline:
        opts = {"prefetch": 0, **self.knob, **extra}
        return self.recipe.pipeline(self.sources).options(canonical_replicas=self.C, dp_degree=G, dp_group_id=gid, **opts)


# -- 1. elastic equivalence -------------------------------------------------------------
@st.composite
def elastic_schedules(draw: st.DrawFn) -> tuple[int, int, list[tuple[int, int]], int]:
    C = draw(st.sampled_from(CANONICAL_REPLICAS))
    k = draw(st.integers(1, 2))
    phases = draw(st.lists(st.tuples(st.sampled_from(divisors(C)), st.integers(1, 3)), min_size=1, max_size=4))
    G_ref = draw(st.sampled_from(divisors(C)))
    return C, k, phases, G_ref


@pytest.mark.topology
@examples(30)
@given(recipe=recipes(), schedule=elastic_schedules(), knob=knobs())
def test_elastic_equivalence_per_step(recipe: Recipe, schedule: tuple[int, int, list[tuple[int, int]], int], knob: dict[str, int]) -> None:
    check_elastic_equivalence(recipe, schedule, knob)


def check_elastic_equivalence(recipe: Any, schedule: tuple[int, int, list[tuple[int, int]], int], knob: dict[str, int]) -> None:
    C, k, phases, G_ref = schedule
    make = Maker(recipe, C, knob)
    bps = k * C
    total = sum(s for _, s in phases)
    reference = run_schedule(make, [Phase(G_ref, total)], bps)
    elastic = run_schedule(make, [Phase(G, s) for G, s in phases], bps)
    assert len(reference) == len(elastic) == total
    bad = first_mismatch(reference, elastic)
    assert bad is None, f"global step {bad} differs (phases {phases}, C={C}, reference dp_degree={G_ref})"
    for step, (r, e) in enumerate(zip(reference, elastic)):
        assert r.segments == e.segments, f"global step {step}: same digests, different provenance"
        assert len(e.digests) == bps * recipe.batch_size
    # Over the whole run, no row (identified by its provenance) lost or repeated.
    assert all_segments(elastic) == all_segments(reference)


# -- 2. checkpoint at any batch ------------------------------------------------------------
@st.composite
def cut_plans(draw: st.DrawFn) -> tuple[int, int, int, int, list[int], list[dict[str, int]]]:
    C = draw(st.sampled_from(CANONICAL_REPLICAS))
    G = draw(st.sampled_from(divisors(C)))
    gid = draw(st.integers(0, G - 1))
    total = draw(st.integers(1, 3 * (C // G) + 6))
    cuts = sorted(draw(st.sets(st.integers(0, total), min_size=1, max_size=3)))
    segment_knobs = draw(st.lists(knobs(), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    return C, G, gid, total, cuts, segment_knobs


@examples(40)
@given(recipe=recipes(finite=True), plan=cut_plans())
def test_checkpoint_at_any_batch_restores_byte_identically(recipe: Recipe, plan: tuple[int, int, int, int, list[int], list[dict[str, int]]]) -> None:
    check_cuts_restore_identically(recipe, plan)


def check_cuts_restore_identically(recipe: Any, plan: tuple[int, int, int, int, list[int], list[dict[str, int]]]) -> None:
    C, G, gid, total, cuts, segment_knobs = plan
    make = Maker(recipe, C)
    with make(G, gid) as ref_pipe:
        reference = take_upto(ref_pipe, total)

    got: list[Any] = []
    state: dict[str, Any] | None = None
    bounds = cuts + [total]
    prev = 0
    for stop, knob in zip(bounds, segment_knobs):
        with make(G, gid, **knob) as p:
            if state is not None:
                p.restore(state)
                assert p.checkpoint() == state, "a restored, not yet iterated pipeline must report the state it restored"
            got.extend(take_upto(p, stop - prev))
            # JSON round trip: the state is plain data.
            state = json.loads(json.dumps(p.checkpoint()))
        prev = stop
        delivered = Counter(b.lane for b in got)
        assert {lane: n for lane, n in delivered_per_lane(state).items() if n} == dict(delivered)
        if got:
            last = {b.lane: b for b in got}
            for lane, b in last.items():
                assert state["lanes"][str(lane)]["cursor"] == list(b.cursor)
    assert [batch_key(b) for b in got] == [batch_key(b) for b in reference]
    if len(reference) < total:  # the curriculum ended: a restored pipeline must end too
        with make(G, gid) as p:
            assert state is not None
            p.restore(state)
            assert take_upto(p, 1) == []


# -- 3. execution knobs never change the data -------------------------------------------
@examples(25)
@given(
    recipe=text_recipes(),
    C=st.sampled_from(CANONICAL_REPLICAS),
    data=st.data(),
    map_par=st.sampled_from([1, 4]),
    tok_par=st.sampled_from([1, 4]),
    knob=knobs(),
    n=st.integers(1, 12),
)
def test_execution_knobs_do_not_change_data(recipe: Any, C: int, data: st.DataObject, map_par: int, tok_par: int, knob: dict[str, int], n: int) -> None:
    G = data.draw(st.sampled_from(divisors(C)), label="dp_degree")
    gid = data.draw(st.integers(0, G - 1), label="dp_group_id")
    ident = {"canonical_replicas": C, "dp_degree": G, "dp_group_id": gid}
    base = recipe.pipeline(map_parallelism=1, tok_parallelism=1, runner="thread").options(prefetch=0, readahead=0, reader_threads=0, **ident)
    tuned = recipe.pipeline(map_parallelism=map_par, tok_parallelism=tok_par, runner="thread").options(**knob, **ident)
    assert base.definition() == tuned.definition(), "parallelism and execution options must not enter the data definition"
    with base, tuned:
        a, b = take(base, n), take(tuned, n)
        assert [batch_key(x) for x in a] == [batch_key(x) for x in b]
        assert base.checkpoint() == tuned.checkpoint()


@settings(max_examples=12 if SOAK else 3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=text_recipes(), C=st.sampled_from([1, 2, 4]), knob=knobs(), n=st.integers(1, 8))
def test_process_runner_does_not_change_data(recipe: Any, C: int, knob: dict[str, int], n: int) -> None:
    ident = {"canonical_replicas": C, "dp_degree": 1, "dp_group_id": 0}
    base = recipe.pipeline(map_parallelism=1, tok_parallelism=1, runner="thread").options(prefetch=0, readahead=0, reader_threads=0, **ident)
    proc = recipe.pipeline(map_parallelism=2, tok_parallelism=2, runner="process").options(**knob, **ident)
    with base, proc:
        assert [batch_key(x) for x in take(base, n)] == [batch_key(x) for x in take(proc, n)]


# -- 4. restore cost does not depend on position -------------------------------------------
def _state_at(recipe: Recipe, C: int, lane: int, *, batches: int = 0, min_chunk: int = 0) -> dict[str, Any]:
    """The state of ``lane`` after ``batches`` batches, or once its cursor reached lane chunk ``min_chunk``."""
    with recipe.pipeline().options(canonical_replicas=C, dp_degree=C, dp_group_id=lane, prefetch=0) as p:
        it = iter(p)
        for n in range(10_000):
            if n >= batches and p.checkpoint()["lanes"][str(lane)]["cursor"][0] >= min_chunk:
                return p.checkpoint()
            next(it)
    raise AssertionError("lane did not advance")


def _restore_reads(recipe: Recipe, C: int, lane: int, state: dict[str, Any]) -> int:
    """Documents read to restore ``lane`` from ``state`` and produce one more batch."""
    counting = recipe.sources(CountingMemorySource)
    # Synchronous reading: no speculative readahead, so the count is exact.
    with recipe.pipeline(counting).options(canonical_replicas=C, dp_degree=C, dp_group_id=lane, prefetch=0, reader_threads=0, readahead=0) as q:
        q.restore(state)
        take(q, 1)
    return sum(s.reads for s in counting)


@examples(25)
@given(
    recipe=recipes(min_doc_len=1, max_doc_len=10, max_seq_len=6),
    C=st.sampled_from([1, 2, 3, 4]),
    data=st.data(),
    early=st.integers(0, 2),
)
def test_restore_cost_is_independent_of_position(recipe: Recipe, C: int, data: st.DataObject, early: int) -> None:
    lane = data.draw(st.integers(0, C - 1), label="lane")
    W = recipe.shuffle_window or 0
    cs = recipe.chunk_size
    # Rows the restore and the next batch can need: a window refill, the batch, and one more window.
    rows = 2 * W + recipe.batch_size
    # Every document has >= 1 token, so a row touches at most seq_len + 2 documents.
    bound = (math.ceil(rows * (recipe.seq_len + 2) / cs) + 2) * cs
    # Late: far enough into the lane that replaying it from its start would read more than the bound.
    late_chunk = bound // cs + 1
    reads_early = _restore_reads(recipe, C, lane, _state_at(recipe, C, lane, batches=early))
    reads_late = _restore_reads(recipe, C, lane, _state_at(recipe, C, lane, min_chunk=late_chunk))
    assert reads_early <= bound, f"restore at batch {early} read {reads_early} documents (bound {bound})"
    assert reads_late <= bound, f"restore at lane chunk >= {late_chunk} read {reads_late} documents; at batch {early} {reads_early} (bound {bound})"


# -- 5. mid-step checkpoint, resumed on another topology ----------------------------------
@st.composite
def mid_step_plans(draw: st.DrawFn) -> tuple[int, int, int, int, int]:
    C = draw(st.sampled_from([c for c in CANONICAL_REPLICAS if c > 1]))
    G1 = draw(st.sampled_from(divisors(C)))
    # Per-group batches before the checkpoint, chosen so that the total is not a multiple of C.
    m1 = draw(st.integers(1, 2 * C // G1 + 1).filter(lambda m: (G1 * m) % C != 0))
    G2 = draw(st.sampled_from(divisors(C)))
    m2 = draw(st.integers(0, 2 * C // G2 + 1))
    return C, G1, m1, G2, m2


@pytest.mark.topology
@examples(30)
@given(recipe=recipes(), plan=mid_step_plans(), knob=knobs())
def test_mid_step_checkpoint_on_other_topology_loses_and_repeats_nothing(recipe: Recipe, plan: tuple[int, int, int, int, int], knob: dict[str, int]) -> None:
    C, G1, m1, G2, m2 = plan
    make = Maker(recipe, C, knob)
    records, state = run_phase(make, Phase(G1, 1), G1 * m1, None)
    assert sum(delivered_per_lane(state).values()) == G1 * m1
    if m2:
        more, state = run_phase(make, Phase(G2, 1), G2 * m2, state)
        records += more
    delivered = delivered_per_lane(state)
    assert sum(delivered.values()) == G1 * m1 + G2 * m2, "the merged state lost or invented batches"

    # Against each lane's own stream: exactly its first `delivered` batches, each once.
    per_lane: list[Any] = []
    for lane in range(C):
        with make(C, lane) as p:
            per_lane.extend(take(p, delivered.get(lane, 0)))
    assert all_rows(records) == row_counter(per_lane)

    # Top up on one group (fewest-delivered lane first) until every lane has delivered
    # as many batches as the most advanced one: the run then equals whole
    # uninterrupted steps of C batches, on any dp_degree.
    M = max(delivered.values())
    need = sum(M - delivered.get(lane, 0) for lane in range(C))
    if need:
        more, state = run_phase(make, Phase(1, 1), need, state)
        records += more
    assert set(delivered_per_lane(state).values()) == {M}
    reference = run_schedule(make, [Phase(G2, M)], C) if M else []
    assert all_rows(records) == all_rows(reference)
    assert all_segments(records) == all_segments(reference)


@pytest.mark.parametrize("C", [4, 8])
def test_mid_step_grouping_may_differ_but_rows_do_not(C: int) -> None:
    """A fixed example: 8 -> 2 with a half-step checkpoint regroups rows but keeps them all."""
    recipe = Recipe(
        docs=(tuple(tuple(range(i, i + 3 + i % 5)) for i in range(20)),),
        weights=(1.0,),
        seed=7,
        chunk_size=4,
        seq_len=4,
        mode="concat",
        shuffle_window=None,
        shuffle_seed=0,
        batch_size=1,
    )
    make = Maker(recipe, C)
    half = C // 2
    # half the groups of C, one batch each: a checkpoint in the middle of a step of C batches
    first, state = run_phase(make, Phase(half, 1), half, None)
    # resumed on 2 groups, steps of `half` batches, to a total of 2*C batches
    second, state = run_phase(make, Phase(2, 3), half, state)
    assert set(delivered_per_lane(state).values()) == {2}
    reference = run_schedule(make, [Phase(C, 2)], C)
    assert all_rows(first + second) == all_rows(reference)


# -- 6. staged curricula -----------------------------------------------------------------
@pytest.mark.topology
@examples(25)
@given(recipe=staged_recipes(), schedule=elastic_schedules(), knob=knobs())
def test_staged_curriculum_elastic_equivalence_per_step(recipe: StagedRecipe, schedule: tuple[int, int, list[tuple[int, int]], int],
                                                        knob: dict[str, int]) -> None:
    check_elastic_equivalence(recipe, schedule, knob)


@examples(25)
@given(recipe=staged_recipes(finite=True), plan=cut_plans())
def test_staged_curriculum_checkpoint_at_any_batch_restores_byte_identically(recipe: StagedRecipe, plan: Any) -> None:
    check_cuts_restore_identically(recipe, plan)


@st.composite
def resume_plans(draw: st.DrawFn) -> tuple[int, int, int, int, int, int, int]:
    """C, batches per step, (dp, steps) before the checkpoint, (dp, steps) after it, reference dp."""
    C = draw(st.sampled_from([1, 2, 3, 4, 6]))
    bps = C * draw(st.integers(1, 2))
    return (C, bps, draw(st.sampled_from(divisors(C))), draw(st.integers(1, 6)), draw(st.sampled_from(divisors(C))),
            draw(st.integers(1, 4)), draw(st.sampled_from(divisors(C))))


@pytest.mark.topology
@examples(30)
@given(recipe=staged_recipes().filter(lambda r: len(r.stages) > 1), plan=resume_plans(), data=st.data())
def test_appending_stages_at_a_checkpoint_gives_the_whole_schedule_from_the_start(recipe: StagedRecipe, plan: Any, data: st.DataObject) -> None:
    C, bps, G1, m1, G2, m2, G_ref = plan
    kept = data.draw(st.integers(1, len(recipe.stages) - 1), label="stages before the resume")
    sources = recipe.sources()

    def maker(upto: int | None) -> Any:
        return lambda G, gid: recipe.pipeline(sources, upto).options(canonical_replicas=C, dp_degree=G, dp_group_id=gid, prefetch=0)

    first, state = run_phase(maker(kept), Phase(G1, m1), bps, None)
    resumed = maker(None)(G2, 0)
    verdict = resumed.resume_verdict(json.loads(json.dumps(state)))
    appended_at = recipe.stages[kept][0]
    event("refused" if not verdict.accepted else "accepted")
    if not verdict.accepted:
        # Refused only because a lane already read the chunk where the appended stage starts.
        assert f"stages[{kept}] ('s{kept}') changes the data from global chunk {appended_at}" in verdict.message, verdict.message
        frontier = int(verdict.message.split("must start at global chunk ")[1].split()[0])
        assert frontier > appended_at
        with pytest.raises(StateError, match="must start at global chunk"):
            resumed.restore(state)
        return
    second, _ = run_phase(maker(None), Phase(G2, m2), bps, state)
    reference = run_schedule(maker(None), [Phase(G_ref, m1 + m2)], bps)
    assert first_mismatch(reference, first + second, provenance=True) is None


@examples(15)
@given(case=window_resumes())
def test_a_refused_resume_names_the_first_chunk_a_stage_may_start_at(case: WindowResume) -> None:
    first = case.pipeline()
    before = take(first, case.batches)
    state = json.loads(json.dumps(first.checkpoint()))
    event("inside a window" if any(lane["cursor"][3] for lane in state["lanes"].values()) else "at a window's start")
    verdict = case.pipeline(case.appended_at).resume_verdict(state)
    event("refused" if not verdict.accepted else "accepted")
    if verdict.accepted:
        return
    first_ok = int(verdict.message.split("must start at global chunk ")[1].split()[0])
    assert first_ok > case.appended_at
    accepted = case.pipeline(first_ok).resume_verdict(state)
    assert accepted.accepted, (verdict.message, accepted.message)
    if first_ok - 1 > case.appended_at:
        assert not case.pipeline(first_ok - 1).resume_verdict(state).accepted, verdict.message
    resumed = case.pipeline(first_ok)
    resumed.restore(state)
    after = take(resumed, 5)
    whole = take(case.pipeline(first_ok), case.batches + 5)
    assert [batch_key(b) for b in before + after] == [batch_key(b) for b in whole]


@examples(40)
@given(recipe=staged_recipes(finite=True), upto=st.integers(1, 60))
def test_staged_sources_never_repeat_or_skip_a_document_within_an_epoch(recipe: StagedRecipe, upto: int) -> None:
    ws = recipe.work_source()
    audit = audit_curriculum(ws, upto)
    assert not audit.problems, audit.problems
    assert audit.chunks == min(upto, ws.num_chunks or upto)
    for s in range(len(ws.sources)):  # the schedule's closed form agrees with the chunks themselves
        assert ws.schedule.position(s, audit.chunks) >= audit.used[s]  # "stop" clips the last chunk
        if ws.num_chunks is None or audit.chunks < ws.num_chunks:
            assert ws.schedule.position(s, audit.chunks) == audit.used[s]
    if ws.num_chunks is not None and upto >= ws.num_chunks:
        # "stop": the curriculum ends with the chunk in which a source of its stage used its last document, none beyond.
        assert max(u / len(src) for u, src in zip(audit.used, ws.sources)) == 1.0
        assert ws.chunk(ws.num_chunks) is None and ws.chunk(ws.num_chunks - 1) is not None


@examples(40)
@given(recipe=staged_recipes(), upto=st.integers(1, 40))
def test_token_stages_give_each_source_its_quota_to_within_one_document(recipe: StagedRecipe, upto: int) -> None:
    ws = recipe.work_source()
    lengths = [np.array([len(d) for d in docs], dtype=np.int64) for docs in recipe.docs]
    sched = ws.schedule
    for plan, end in zip(sched.plans, [*sched.starts[1:].tolist(), upto]):
        if not plan.by_tokens or plan.start_chunk >= upto:
            continue
        end = min(end, upto)
        got = [0] * len(ws.sources)
        for g, chunk in zip(range(plan.start_chunk, end), ws.chunks(list(range(plan.start_chunk, end)))):
            assert chunk is not None
            for s, q in enumerate(plan.per_chunk):
                got[s] += int(lengths[s][chunk.documents[chunk.sources == s]].sum())
                want = (g + 1 - plan.start_chunk) * q
                assert want <= got[s] < want + max(1, int(lengths[s].max())) or q == 0, (plan.name, g, s, got[s], want)
