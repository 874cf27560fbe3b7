"""The fit packing modes, ``max_docs_per_row`` and the pack operator's definition (zephon_core.lane.fit)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zephon_core import ConfigError, MemorySource, Pipeline, StaticMixture
from zephon_core.checkpoint.state import fingerprint_of
from zephon_core.lane.fit import place
from zephon_core.lane.ops import PackOp


def test_place_first_fit_and_best_fit():
    # Rows of 10: 6 opens row 0, 5 row 1; 4 fits row 0 (room 4) and row 1 (room 5).
    assert place([6, 5, 4], 10, best=False, max_docs=0) == [0, 1, 0]
    assert place([6, 5, 4], 10, best=True, max_docs=0) == [0, 1, 0]
    # 3: first fit takes row 0 (room 4), best fit too; 5 then 4 in a fuller case.
    assert place([5, 7, 3, 2], 10, best=False, max_docs=0) == [0, 1, 0, 0]
    assert place([5, 7, 3, 2], 10, best=True, max_docs=0) == [0, 1, 1, 0]
    assert place([10, 1, 10], 10, best=True, max_docs=0) == [0, 1, 2]
    assert place([1, 1, 1], 10, best=False, max_docs=2) == [0, 0, 1]


def test_pack_definition_is_unchanged_for_existing_modes():
    """The options at their defaults are not in the definition: fingerprints of existing pipelines stay (pinned)."""
    assert PackOp(8, "concat", 7).definition() == {"op": "pack", "seq_len": 8, "mode": "concat", "pad_id": 7}
    assert PackOp(8, "pad").definition() == {"op": "pack", "seq_len": 8, "mode": "pad", "pad_id": 0}
    ws = StaticMixture([MemorySource([[1, 2, 3], [4, 5]], name="a")], [1.0], seed=3, chunk_size=4)
    pinned = {  # computed on main, before the fit modes existed
        "concat": "974df984f8988929ef07f63afd09d4736ce057827e6edf0e9448cff72f8085ba",
        "pad": "da1b31fc28fce12664fc1e54ba73bb059748e0f1d682fbe3cdfa74e954f99bcc",
    }
    for mode, fp in pinned.items():
        assert fingerprint_of(Pipeline(ws).pack(8, mode=mode, pad_id=7).shuffle(4, seed=1).batch(2).definition()) == fp


def test_pack_definition_of_the_new_options():
    assert PackOp(8, "best_fit").definition() == {"op": "pack", "seq_len": 8, "mode": "best_fit", "pad_id": 0, "window": 1024}
    d = PackOp(8, "first_fit", window=16, overlong="truncate", max_docs_per_row=3).definition()
    assert d == {"op": "pack", "seq_len": 8, "mode": "first_fit", "pad_id": 0, "window": 16, "overlong": "truncate",
                 "max_docs_per_row": 3}
    assert PackOp(8, "concat", max_docs_per_row=2).definition()["max_docs_per_row"] == 2
    with pytest.raises(ConfigError, match="window is an option of the fit modes"):
        PackOp(8, "pad", window=4)
    with pytest.raises(ConfigError, match="overlong"):
        PackOp(8, "concat", overlong="truncate")
    with pytest.raises(ConfigError, match="overlong"):
        PackOp(8, "best_fit", overlong="drop")


def _pipeline(docs, mode, seq_len=9, **kw):
    ws = StaticMixture([MemorySource(docs, name="a")], [1.0], seed=5, chunk_size=6, exhausted="stop")
    return Pipeline(ws).pack(seq_len, mode=mode, **kw).batch(1, drop_last=False)


def _rows(p):
    with p:
        return [(np.concatenate([b.input_ids[0], b.labels[0, -1:]]), b.provenance[0]) for b in p]


@pytest.mark.parametrize("mode", ["first_fit", "best_fit"])
def test_fit_rows_keep_short_documents_whole_and_deliver_every_token_once(mode):
    rng = np.random.default_rng(1)
    docs = [list(range(100 * d, 100 * d + int(n))) for d, n in enumerate(rng.integers(0, 25, 60))]
    rows = _rows(_pipeline(docs, mode, window=8))
    seen: dict[int, list[tuple[int, int]]] = {}
    for tokens, segments in rows:
        at = 0
        for s in segments:
            np.testing.assert_array_equal(tokens[at : at + s.stop - s.start], docs[s.document][s.start : s.stop])
            at += s.stop - s.start
            seen.setdefault(s.document, []).append((s.start, s.stop))
            if len(docs[s.document]) <= 10:
                assert (s.start, s.stop) == (0, len(docs[s.document]))  # a document that fits a row is never cut
    for d, doc in enumerate(docs):
        covered = sorted(seen.get(d, []))
        assert sum(b - a for a, b in covered) == len(doc)
        assert all(x[1] == y[0] for x, y in zip(covered, covered[1:]))


@pytest.mark.parametrize("mode", ["concat", "pad", "first_fit", "best_fit"])
def test_max_docs_per_row(mode):
    docs = [[d + 1] * (1 + d % 3) for d in range(40)]
    rows = _rows(_pipeline(docs, mode, max_docs_per_row=2))
    assert rows and all(len(segments) <= 2 for _, segments in rows)
    assert sum(s.stop - s.start for _, segs in rows for s in segs) == sum(map(len, docs))


def test_truncate_keeps_one_row_and_counts_the_rest():
    docs = [[1] * 25, [2] * 3, [3] * 10, [4] * 11]
    p = _pipeline(docs, "best_fit", overlong="truncate")
    with p:
        batches = list(p)
        stats = p.stats()
        state = json.loads(json.dumps(p.checkpoint()))
    assert sum(lane["tally"].get("truncated", 0) for lane in state["lanes"].values()) == 16
    with _pipeline(docs, "best_fit", overlong="truncate") as q:
        q.restore(state)  # the state carries the count; a state of a run that truncated nothing has no such field
        assert q.stats().dropped_tokens == 16
    segments = [s for b in batches for row in b.provenance for s in row if s.stop > s.start]
    assert sorted((s.document, s.start, s.stop) for s in segments) == [(0, 0, 10), (1, 0, 3), (2, 0, 10), (3, 0, 10)]
    assert stats.dropped_tokens == 15 + 1
    assert stats.scalars()["zephon/dropped_tokens"] == 16


@pytest.mark.parametrize("mode", ["first_fit", "best_fit"])
def test_fit_window_restores_by_seek_and_composes_with_shuffle(mode):
    docs = [[d + 1] * (1 + (7 * d) % 13) for d in range(50)]
    ws = StaticMixture([MemorySource(docs, name="a")], [1.0], seed=2, chunk_size=5)
    make = lambda: Pipeline(ws).pack(8, mode=mode, window=6).shuffle(3, seed=4).batch(2)  # noqa: E731
    with make() as p:
        it = iter(p)
        for _ in range(7):
            next(it)
        state = p.checkpoint()
        rest = [next(it).digest for _ in range(12)]
    with make() as q:
        q.restore(state)
        assert [b.digest for b, _ in zip(q, range(12))] == rest
