"""The ledger (issue #35): its answers equal what the ranks trained on, batch by batch and step by step, through
resizes and a skip; built from the audit logs it equals the ledger by replay row for row, and a log line removed
or altered is refused naming it; document -> steps is the inverse of step -> documents; Parquet holds the same
rows."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core import MemorySource, Pipeline, StaticMixture
from zephon_core.checkpoint.state import skip_in_state
from zephon_core.checkpoint.surgery import surgery_journal_of
from zephon_core.errors import DataError
from zephon_core.integration.batch_log import log_line, parse_line
from zephon_core.pipeline.surgery import quarantined_state
from zephon_core.verify.ledger import COLUMNS, build_ledger, content_hash
from zephon_core.verify.ledger_logs import ledger_from_logs
from zephon_core.verify.simulate import Phase, run_phase

DOCS = [[1 + i % 7] * (3 + i % 5) for i in range(60)]
C = 4


def _make(dp_degree: int, dp_group_id: int) -> Pipeline:
    ws = StaticMixture([MemorySource(DOCS, name="m")], seed=5, chunk_size=4)
    return (Pipeline(ws).pack(8).shuffle(3, seed=2).batch(2)
            .options(canonical_replicas=C, dp_degree=dp_degree, dp_group_id=dp_group_id, prefetch=0))


def _sources(n: int) -> list[MemorySource]:
    return [MemorySource(DOCS[k::n], name=f"s{k}" if n > 1 else "m") for k in range(n)]


def _recipe(n_sources: int, chunk: int, seq: int, rows: int):
    """A pipeline factory like ``_make`` over ``n_sources`` sources (``DOCS`` dealt out), chunks, rows and batches of
    the sizes given."""
    def make(dp_degree: int, dp_group_id: int) -> Pipeline:
        ws = StaticMixture(_sources(n_sources), seed=5, chunk_size=chunk)
        return (Pipeline(ws).pack(seq).shuffle(3, seed=2).batch(rows)
                .options(canonical_replicas=C, dp_degree=dp_degree, dp_group_id=dp_group_id, prefetch=0))
    return make


def _run(phases: list[tuple[int, int]], B: int, skip: tuple[int, int] | None, make=_make,
         quarantine: list[tuple[str, int]] | None = None):
    """The run's trained (step, lane, lane_index, rows' segments), audit lines as ``(file, line)`` (a file a phase
    and group), and its last state; ``skip`` (steps after the first phase's) and ``quarantine`` are journaled
    before the second phase."""
    trained, lines, state = [], [], None
    done = 0
    for n, (G, steps) in enumerate(phases):
        if n == 1 and skip is not None:
            state = skip_in_state(json.loads(json.dumps(state)), done + 1 + skip[0], done + 1 + skip[1], B)
        if n == 1 and quarantine:
            state = quarantined_state(make(1, 0), state, quarantine)
        def on_batch(gid, b):
            trained.append((b.lane_index // (B // C) + 1, b.lane, b.lane_index, b.segments.tolist()))
            lines.append((f"phase{n}-batches-{gid}.log", log_line(b)))
        _, state = run_phase(make, Phase(G, steps), B, state, on_batch=on_batch)
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
    logged = [(where, parse_line(line)) for where, line in lines]
    assert ledger.check_logs(logged) == []
    assert len(ledger.digests) == len(logged)
    from_logs = ledger_from_logs(logged, state, B, [_source()])
    assert from_logs.built == "logs" and from_logs.extras == [] and from_logs.digests == ledger.digests
    assert _table(from_logs).tolist() == _table(ledger).tolist()  # row for row, in the same order
    for step in {t[0] for t in trained}:
        want = sorted((lane, index, *seg) for s, lane, index, segs in trained if s == step for seg in segs)
        got = sorted((r[0], r[1], r[3], 0, r[5], r[6], r[7]) for r in ledger.rows_of(step))
        assert got == want
        for *_, source, document, _start, _stop in want:
            assert step in ledger.steps_of(source, document)
    assert set(ledger.columns["step"].tolist()) == {t[0] for t in trained}  # skipped steps are not in it


def _source() -> MemorySource:
    return _sources(1)[0]


@settings(max_examples=12, deadline=None)
@given(phases=st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.integers(1, 3)), min_size=2, max_size=3),
       recipe=st.tuples(st.integers(1, 3), st.sampled_from([3, 4, 6]), st.sampled_from([5, 8, 13]), st.integers(1, 2)),
       per_lane=st.sampled_from([1, 2]), skip=st.one_of(st.none(), st.tuples(st.integers(0, 1), st.integers(1, 2))),
       quarantined=st.lists(st.integers(0, 19), max_size=3))
def test_on_random_recipes_the_ledger_from_logs_is_the_ledger_by_replay(phases, recipe, per_lane, skip, quarantined):
    """Sources, chunk, row and batch sizes, degrees, a skip and a quarantine drawn: row for row the same ledger,
    the same digests, and the logs check clean against the replay."""
    B, make = C * per_lane, _recipe(*recipe)
    skip = None if skip is None or skip[0] > skip[1] else skip
    _, lines, state = _run(phases, B, skip, make, [(f"s{d % recipe[0]}" if recipe[0] > 1 else "m", d)
                                                   for d in quarantined])
    assert bool(surgery_journal_of(state).quarantines) == bool(quarantined)
    logged = [(where, parse_line(line)) for where, line in lines]
    replayed = build_ledger(lambda: make(1, 0), state, B)
    from_logs = ledger_from_logs(logged, state, B, _sources(recipe[0]))
    assert replayed.check_logs(logged) == [] and from_logs.extras == []
    assert from_logs.digests == replayed.digests and from_logs.sources == replayed.sources
    assert _table(from_logs).tolist() == _table(replayed).tolist()


def _table(ledger) -> np.ndarray:
    return np.stack([ledger.columns[k] for k in COLUMNS], axis=1)


def test_a_wrong_log_line_and_a_missing_log_are_named():
    trained, lines, state = _run([(2, 2)], C, None)
    ledger = build_ledger(lambda: _make(1, 0), state, C)
    logged = [(where, parse_line(line)) for where, line in lines]
    bad = [(w, b._replace(digest="0" * 32) if n == 3 else b) for n, (w, b) in enumerate(logged)]
    problems = ledger.check_logs(bad[:-1])
    assert any("digest 000" in p for p in problems) and any("in no log" in p for p in problems)


def _edited(line: str, field: int, value: str) -> str:
    fields = line.split()
    fields[field] = value
    return " ".join(fields) + "\n"


def test_a_log_line_removed_or_altered_is_refused_naming_it():
    _, lines, state = _run([(2, 2)], C, None)
    logs = [(where, parse_line(line)) for where, line in lines]
    where, b = logs[5]
    with pytest.raises(DataError, match=f"lane {b.lane} batch {b.lane_index} .*is in no log"):
        ledger_from_logs(logs[:5] + logs[6:], state, C, [_source()])
    rows = b.rows.replace(".", ".1", 1)  # its first stretch names another document
    moved = parse_line(_edited(lines[5][1], 6, rows))
    ledger = build_ledger(lambda: _make(1, 0), state, C)
    assert ledger.check_logs(logs[:5] + [(where, moved)] + logs[6:]) == [
        f"lane {b.lane} batch {b.lane_index} ({where}): the log's rows are not the ledger's"]
    for field, value, what in ((6, rows, "rows"), (2, "f" * 32, "digest")):
        copy = ("rank9.log", parse_line(_edited(lines[5][1], field, value)))  # a peer logged it too, altered
        with pytest.raises(DataError, match=f"lane {b.lane} batch {b.lane_index}: its {what} in {where} and in "
                                            "rank9.log differ"):
            ledger_from_logs(logs + [copy], state, C, [_source()])
    later = ("rank9.log", parse_line(_edited(lines[5][1], 1, "99")))  # past the state: left out, named
    assert ledger_from_logs(logs + [later], state, C, [_source()]).extras == [f"lane {b.lane} batch 99 (rank9.log)"]


def test_a_batch_logged_by_several_ranks_or_by_its_identity_alone_counts_once():
    _, lines, state = _run([(2, 2)], C, None)
    logs = [(where, parse_line(line)) for where, line in lines]
    peers = [("peer.log", b._replace(stage=-1, tokens={}, documents={}, rows="")) for _, b in logs]
    ledger = ledger_from_logs(peers + logs + logs, state, C, [_source()])
    assert _table(ledger).tolist() == _table(build_ledger(lambda: _make(1, 0), state, C)).tolist()
    with pytest.raises(DataError, match="only in lines that do not say its rows"):
        ledger_from_logs(peers, state, C, [_source()])


def test_parquet_holds_every_row_with_its_source_name_and_hash(tmp_path):
    _, lines, state = _run([(2, 3)], C, None)
    ledger = ledger_from_logs([(w, parse_line(line)) for w, line in lines], state, C, [_source()])
    assert not ledger._hashes  # no document is read until a hash is asked for
    ledger.write_parquet(str(tmp_path / "l.parquet"))
    table = pq.read_table(tmp_path / "l.parquet").to_pydict()
    assert len(table["step"]) == len(ledger)
    assert set(table["source"]) == {"m"}
    for d, h in zip(table["document"], table["hash"]):
        assert h == content_hash(DOCS[d])
    same = ledger.documents_of(table["hash"][0])  # every document of that content
    assert (0, table["document"][0]) in same and all(DOCS[d] == DOCS[table["document"][0]] for _, d in same)
    assert ledger.documents_of("m#7") == [(0, 7)]
