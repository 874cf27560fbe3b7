"""Pipeline.stats(), the lanes' tallies and the batch audit log.

The tallies travel in the checkpoint state, so the run-wide figures are sums over the lanes of
a merged state. The property test holds them against what the batches themselves carried,
through random recipes, lane counts and resizes; the rest pin the snapshot's fields, the
version 1 migration, the strict parsing and the audit line format.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.property_strategies import CANONICAL_REPLICAS, divisors, recipes

from zephon_core import DataError, MemorySource, Pipeline, Stage, StagedMixture, StateError, StaticMixture
from zephon_core.checkpoint.state import checksum_of, parse_lanes
from zephon_core.integration.batch_log import log_line, parse_line, read_batch_log
from zephon_core.metrics import COUNTER_NAMES, COUNTERS, sum_tallies
from zephon_core.verify.simulate import Phase, run_phase


def _expected(segments: list[Any], n_sources: int) -> tuple[list[int], list[int], int]:
    """Tokens and documents per source, and continued stretches, of a run's row provenance."""
    tokens, docs, cut = [0] * n_sources, [0] * n_sources, 0
    for row in segments:
        for seg in row:
            tokens[seg.source] += seg.stop - seg.start
            if seg.start == 0:
                docs[seg.source] += 1
            else:
                cut += 1
    return tokens, docs, cut


@pytest.mark.topology
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=recipes(), data=st.data())
def test_run_wide_tally_equals_what_every_group_delivered_across_resizes(recipe, data):
    C = data.draw(st.sampled_from(CANONICAL_REPLICAS))
    degrees = data.draw(st.lists(st.sampled_from(divisors(C)), min_size=1, max_size=3))
    steps = data.draw(st.lists(st.integers(1, 3), min_size=len(degrees), max_size=len(degrees)))
    bps = C * data.draw(st.integers(1, 2))

    def make(G: int, g: int) -> Pipeline:
        return recipe.pipeline().options(canonical_replicas=C, dp_degree=G, dp_group_id=g)

    state, segments, rows = None, [], 0
    for G, n in zip(degrees, steps):
        records, state = run_phase(make, Phase(G, n), bps, state)
        for r in records:
            segments.extend(r.segments)
            rows += len(r.digests)
    S = len(recipe.docs)
    whole = sum_tallies([ls.tally for ls in parse_lanes(state).values()], 1, S)
    tokens, docs, cut = _expected(segments, S)
    assert [sum(col) for col in zip(*whole.tokens)] == tokens
    assert [sum(col) for col in zip(*whole.documents)] == docs
    assert (whole.rows, whole.cut, whole.since) == (rows, cut, 0)
    assert whole.padding == rows * (recipe.seq_len + 1) - sum(tokens)
    # Every rank's snapshot after restoring the merged state reports the same run-wide figures.
    p = make(degrees[-1], 0)
    p.restore(state)
    assert [s.run_tokens for s in p.stats().sources] == tokens


def _staged(**opts: Any) -> Pipeline:
    a = MemorySource([[1] * (3 + i % 5) for i in range(40)], name="web")
    b = MemorySource([[2] * (2 + i % 3) for i in range(30)], name="code")
    ws = StagedMixture([a, b], [Stage({"web": 3, "code": 1}, "warmup"), Stage({"web": 1, "code": 1}, "anneal", start_chunk=6)],
                       seed=3, chunk_size=8)
    return Pipeline(ws).pack(8).shuffle(4).batch(2).options(canonical_replicas=4, dp_degree=2, dp_group_id=0, **opts)


def test_stats_follow_the_stages_lanes_and_sources():
    p = _staged()
    it = iter(p)
    first = p.stats()
    assert first.batches == 0 and first.run_batches is None and first.stage_name == "warmup"
    seen_stages = set()
    for _ in range(40):
        b = next(it)
        seen_stages.add(b.stage)
    s = p.stats()
    assert seen_stages == {0, 1} and s.stage == 1 and s.stage_name == "anneal"
    assert [ln.lane for ln in s.lanes] == [0, 1] and sum(ln.delivered for ln in s.lanes) == 40 == s.batches
    web, code = s.sources
    assert (web.name, web.size, code.size) == ("web", 40, 30)
    assert web.epochs == pytest.approx(web.documents / 40) and code.epochs == pytest.approx(code.documents / 30)
    assert web.run_tokens is None  # no merged state yet
    state = p.checkpoint()
    after = p.stats()
    assert after.run_lanes == 2 and after.run_batches == 40  # world_size 1: the run is this group's lanes
    assert [x.run_tokens for x in after.sources] == [web.tokens, code.tokens]
    assert sum(x.run_share or 0 for x in after.sources) == pytest.approx(1.0)
    # Per stage, the tallies split the same totals.
    whole = sum_tallies([ls.tally for ls in parse_lanes(state).values()], 2, 2)
    assert [sum(col) for col in zip(*whole.tokens)] == [web.tokens, code.tokens] and all(whole.tokens[1])


def test_execution_knobs_never_change_the_tallies():
    def run(**opts: Any) -> dict[str, Any]:
        with _staged(**opts) as p:
            it = iter(p)
            for _ in range(25):
                next(it)
            return p.checkpoint()["lanes"]

    base = run()
    assert run(prefetch=3) == base
    assert run(reader_threads=2, readahead=3) == base


def test_counters_record_waiting_reading_and_packing():
    before = COUNTERS.snapshot()
    with _staged() as p:
        it = iter(p)
        for _ in range(10):
            next(it)
        s = p.stats()
    assert set(s.counters) == set(COUNTER_NAMES)
    for name in ("read_s", "pack_s"):
        assert s.counters[name] > before[name], name
    assert s.wait_s > 0
    scalars = s.scalars()
    assert scalars["zephon/tokens/web"] == s.sources[0].tokens and scalars["zephon/stage"] == s.stage
    assert all(k.startswith("zephon/") for k in scalars) and "zephon/run/tokens/web" not in scalars


def _as_version_1(state: dict[str, Any]) -> dict[str, Any]:
    old = json.loads(json.dumps(state))
    old["version"] = 1
    for lane in old["lanes"].values():
        del lane["tally"]
    old.pop("checksum")
    old["checksum"] = checksum_of(old)
    return old


def test_a_version_1_state_restores_and_counts_from_its_position():
    p = _staged()
    it = iter(p)
    for _ in range(6):
        next(it)
    old = _as_version_1(p.checkpoint())
    q = _staged()
    q.restore(old)
    it = iter(q)
    for _ in range(4):
        next(it)
    s = q.stats()
    assert s.counted_since == 3 and s.batches == 10  # each lane had delivered 3 when counting began
    assert s.rows == 8  # only the batches since the restore are counted
    lanes = q.checkpoint()["lanes"]
    assert {lane["tally"]["since"] for lane in lanes.values()} == {3}


@pytest.mark.parametrize("edit, field", [
    (lambda t: t.pop("cut"), "lanes['0'].tally must have exactly the fields"),
    (lambda t: t.update(rows=-1), "lanes['0'].tally.rows"),
    (lambda t: t.update(tokens=[[1, "x"]]), "lanes['0'].tally.tokens[0][1]"),
    (lambda t: t.update(documents=[[1]], tokens=[[1, 2]]), "tokens and documents must have the same shape"),
])
def test_a_malformed_tally_is_refused_naming_its_field(edit, field):
    p = _staged()
    it = iter(p)
    next(it)
    state = p.checkpoint()
    edit(state["lanes"]["0"]["tally"])
    with pytest.raises(StateError, match=field.replace("[", r"\[").replace("]", r"\]")):
        _staged().restore(state)


def test_audit_lines_carry_the_stage_and_per_source_counts(tmp_path):
    log = tmp_path / "batches-rank0.log"
    with _staged() as p:
        it = iter(p)
        batches = [next(it) for _ in range(30)]
    log.write_text("".join(log_line(b) for b in batches) + "0 5 abc\n")
    read = list(read_batch_log(log))
    for b, r in zip(batches, read):
        seg = b.segments
        want = Counter()
        for src, start, stop in zip(seg[:, 1].tolist(), seg[:, 3].tolist(), seg[:, 4].tolist()):
            want[src] += stop - start
        assert (r.lane, r.lane_index, r.digest, r.stage) == (b.lane, b.lane_index, b.digest, b.stage)
        assert r.tokens == dict(want) and sum(r.documents.values()) == int(np.sum(seg[:, 3] == 0))
    assert read[-1] == (0, 5, "abc", -1, {}, {}, "", "", "")  # the first format still reads (no run, no launch)
    log.write_text("1 2 abc 0 0:x -\n")
    with pytest.raises(DataError, match="batches-rank0.log line 1"):
        list(read_batch_log(log))
    assert parse_line("3 4 d 1 - -").tokens == {}


def test_stats_cost_no_data_reads():
    src = MemorySource([[1, 2, 3]] * 20, name="m")
    p = Pipeline(StaticMixture([src], seed=0, chunk_size=4)).pack(4).batch(1).options(reader_threads=0, readahead=0)
    it = iter(p)
    next(it)
    reads = COUNTERS.snapshot()["read_s"]
    for _ in range(50):
        p.stats()
    assert COUNTERS.snapshot()["read_s"] == reads


def test_the_wait_goes_on_counting_through_a_mixing_decision():
    """A decision rebuilds the pipeline (``switched``): its wait counter started over, so the interval after every
    decision logged a negative wait ('waited -0.061 s of 2.89 s', issue #40 item 7)."""
    from zephon_core.curriculum.controllers import IdentityController
    from zephon_core.pipeline.mixing import Mixing, MixingLoader

    sources = [MemorySource([[k + 1] * 9 for _ in range(40)], name=f"s{k}") for k in range(2)]
    pipe = Pipeline(StaticMixture(sources, [1, 1], seed=1, chunk_size=4)).pack(8).batch(2).options(canonical_replicas=2)
    loader = MixingLoader(pipe, Mixing(IdentityController({"s0": 3, "s1": 1}), interval_steps=1))
    for _ in range(6):
        next(loader)
    before = loader.pipeline.stats().wait_s
    assert before > 0 and loader.decide(1) is not None
    assert loader.pipeline.stats().wait_s >= before
    next(loader)
    assert loader.pipeline.stats().wait_s > before
    loader.close()
