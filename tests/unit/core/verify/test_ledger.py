"""The ledger (issue #35): its answers equal what the ranks trained on, batch by batch and step by step, through
resizes and a skip; document -> steps is the inverse of step -> documents; Parquet holds the same rows."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core import MemorySource, Pipeline, StaticMixture
from zephon_core.checkpoint.state import skip_in_state
from zephon_core.integration.batch_log import log_line, parse_line
from zephon_core.verify.ledger import build_ledger, content_hash
from zephon_core.verify.simulate import Phase, run_phase

DOCS = [[1 + i % 7] * (3 + i % 5) for i in range(60)]
C = 4


def _make(dp_degree: int, dp_group_id: int) -> Pipeline:
    ws = StaticMixture([MemorySource(DOCS, name="m")], seed=5, chunk_size=4)
    return (Pipeline(ws).pack(8).shuffle(3, seed=2).batch(2)
            .options(canonical_replicas=C, dp_degree=dp_degree, dp_group_id=dp_group_id, prefetch=0))


def _run(phases: list[tuple[int, int]], B: int, skip: tuple[int, int] | None):
    """The run's trained (step, lane, lane_index, rows' segments) and audit lines, and its last state."""
    trained, lines, state = [], [], None
    done = 0
    for n, (G, steps) in enumerate(phases):
        if n == 1 and skip is not None:
            state = skip_in_state(json.loads(json.dumps(state)), done + 1 + skip[0], done + 1 + skip[1], B)
        def on_batch(gid, b):
            trained.append((b.lane_index // (B // C) + 1, b.lane, b.lane_index, b.segments.tolist()))
            lines.append(log_line(b))
        _, state = run_phase(_make, Phase(G, steps), B, state, on_batch=on_batch)
        done += steps if n == 0 else 0
    return trained, lines, state


@settings(max_examples=10, deadline=None)
@given(phases=st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.integers(1, 3)), min_size=2, max_size=3),
       per_lane=st.sampled_from([1, 2]), skip=st.one_of(st.none(), st.tuples(st.integers(0, 1), st.integers(1, 3))))
def test_the_ledger_answers_what_the_ranks_trained_on_at_every_step(phases, per_lane, skip):
    B = C * per_lane
    skip = None if skip is None or skip[0] > skip[1] else skip
    trained, lines, state = _run(phases, B, skip)
    ledger = build_ledger(lambda: _make(1, 0), state, B)
    logged = [parse_line(line) for line in lines]
    assert ledger.check_logs((b.lane, b.lane_index, b.digest) for b in logged) == []
    assert len(ledger.digests) == len(logged)
    for step in {t[0] for t in trained}:
        want = sorted((lane, index, *seg) for s, lane, index, segs in trained if s == step for seg in segs)
        got = sorted((r[0], r[1], r[3], 0, r[5], r[6], r[7]) for r in ledger.rows_of(step))
        assert got == want
        for *_, source, document, _start, _stop in want:
            assert step in ledger.steps_of(source, document)
    assert set(ledger.columns["step"].tolist()) == {t[0] for t in trained}  # skipped steps are not in it


def test_a_wrong_log_line_and_a_missing_log_are_named():
    trained, lines, state = _run([(2, 2)], C, None)
    ledger = build_ledger(lambda: _make(1, 0), state, C)
    logged = [parse_line(line) for line in lines]
    bad = [(b.lane, b.lane_index, "0" * 32 if n == 3 else b.digest) for n, b in enumerate(logged)]
    problems = ledger.check_logs(bad[:-1])
    assert any("digest 000" in p for p in problems) and any("in no log" in p for p in problems)


def test_parquet_holds_every_row_with_its_source_name_and_hash(tmp_path):
    _, _, state = _run([(2, 3)], C, None)
    ledger = build_ledger(lambda: _make(1, 0), state, C)
    ledger.write_parquet(str(tmp_path / "l.parquet"))
    table = pq.read_table(tmp_path / "l.parquet").to_pydict()
    assert len(table["step"]) == len(ledger)
    assert set(table["source"]) == {"m"}
    for d, h in zip(table["document"], table["hash"]):
        assert h == content_hash(DOCS[d])
    same = ledger.documents_of(table["hash"][0])  # every document of that content
    assert (0, table["document"][0]) in same and all(DOCS[d] == DOCS[table["document"][0]] for _, d in same)
    assert ledger.documents_of("m#7") == [(0, 7)]
