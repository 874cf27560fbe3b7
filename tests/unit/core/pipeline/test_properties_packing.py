"""Property-based tests (hypothesis) of the packing modes: concat, pad, first_fit, best_fit, with random
``window``, ``overlong`` and ``max_docs_per_row``.

1. over a finite curriculum, through random checkpoints, restores and dp resizes (C lanes, dp dividing C),
   every token of every document is delivered exactly once (``truncate``: exactly the first row's worth,
   the rest counted in the tallies' ``truncated``); no row holds more than ``max_docs_per_row`` documents; the
   fit modes cut no document that fits a row;
2. elastic equivalence per global step, as for the other recipes (test_properties.py);
3. a checkpoint at any batch restores byte-identically;
4. restoring costs reads bounded by the fit and shuffle windows, not by the position.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.property_strategies import CANONICAL_REPLICAS, Recipe, divisors, recipes  # noqa: E402
from test_properties import (  # noqa: E402
    Maker,
    _restore_reads,
    _state_at,
    check_cuts_restore_identically,
    check_elastic_equivalence,
    cut_plans,
    elastic_schedules,
    examples,
    knobs,
)

from zephon_core.lane.ops import FIT_MODES  # noqa: E402
from zephon_core.verify.simulate import Phase, StepRecord, run_phase  # noqa: E402

MODES = ("concat", "pad", "first_fit", "best_fit")


@st.composite
def packing_recipes(draw: st.DrawFn, *, finite: bool = False, min_doc_len: int = 0, max_doc_len: int = 24,
                    max_seq_len: int = 12) -> Recipe:
    base = draw(recipes(finite=finite, min_doc_len=min_doc_len, max_doc_len=max_doc_len, max_seq_len=max_seq_len))
    mode = draw(st.sampled_from(MODES))
    options: dict[str, Any] = {}
    if mode in FIT_MODES:
        options["window"] = draw(st.integers(1, 9))
        options["overlong"] = draw(st.sampled_from(["split", "truncate"]))
    max_docs = draw(st.integers(0, 3))
    if max_docs:
        options["max_docs_per_row"] = max_docs
    return replace(base, mode=mode, pack_options=tuple(sorted(options.items())))


def _curriculum_documents(recipe: Recipe, pipeline: Any) -> Counter[tuple[int, int]]:
    """How often each ``(source, document)`` occurs in the finite curriculum's chunks."""
    ws = pipeline.work_source
    out: Counter[tuple[int, int]] = Counter()
    g = 0
    while True:
        (chunk,) = ws.chunks([g])
        if chunk is None:
            return out
        out.update(zip(chunk.sources.tolist(), chunk.documents.tolist()))
        g += 1


def _run_to_end(make: Maker, C: int, phases: list[tuple[int, int]]) -> tuple[list[StepRecord], dict[str, Any]]:
    """Every step of a finite run through ``phases`` (dp degree, batches per group), then to the end on dp=C."""
    state: dict[str, Any] | None = None
    records: list[StepRecord] = []
    plan: list[tuple[int, int | None]] = [*phases, (C, None)]
    for G, n in plan:
        more, state = run_phase(make, Phase(G, n), G, state)
        records += more
    assert state is not None
    return records, state


@st.composite
def resize_plans(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    C = draw(st.sampled_from(CANONICAL_REPLICAS))
    return C, draw(st.lists(st.tuples(st.sampled_from(divisors(C)), st.integers(0, 4)), max_size=3))


@pytest.mark.topology
@examples(30)
@given(recipe=packing_recipes(finite=True), plan=resize_plans())
def test_every_token_delivered_exactly_once_through_restores_and_resizes(recipe: Recipe, plan: tuple[int, list[tuple[int, int]]]) -> None:
    recipe = replace(recipe, drop_last=False, exhausted="stop")
    C, phases = plan
    make = Maker(recipe, C)
    options = dict(recipe.pack_options)
    width, max_docs = recipe.seq_len + 1, options.get("max_docs_per_row", 0)
    truncate = options.get("overlong") == "truncate"
    records, state = _run_to_end(make, C, phases)
    expected = _curriculum_documents(recipe, make(1, 0))
    stretches: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    dropped = 0
    for r in records:
        for row in r.segments:
            real = [s for s in row if s.stop > s.start]
            assert not max_docs or len(real) <= max_docs, f"row of {len(real)} documents (max_docs_per_row={max_docs})"
            for s in row:
                stretches[(s.source, s.document)].append((s.start, s.stop))
                if s.stop == s.start:  # a truncation marker: the document was L = s.start tokens long
                    dropped += s.start - width
    for (src, doc), count in expected.items():
        L = len(recipe.docs[src][doc])
        kept = min(L, width) if truncate else L
        got = sorted(x for x in stretches.pop((src, doc), []) if x[1] > x[0])
        assert sum(b - a for a, b in got) == count * kept, f"document {doc} of source {src}: {got}, {count} x {kept} tokens expected"
        if count == 1:
            assert all(x[1] == y[0] for x, y in zip(got, got[1:])) and (not got or got[0][0] == 0)
        if recipe.mode in FIT_MODES and 0 < L <= width:
            assert got == [(0, L)] * count, f"a document of {L} <= {width} tokens was cut: {got}"
    assert not [k for k, v in stretches.items() if any(b > a for a, b in v)], "delivered a document not in the curriculum"
    assert sum(ls["tally"].get("truncated", 0) for ls in state["lanes"].values()) == dropped


@pytest.mark.topology
@examples(12)
@given(recipe=packing_recipes(), schedule=elastic_schedules(), knob=knobs())
def test_packing_modes_elastic_equivalence_per_step(recipe: Recipe, schedule: Any, knob: dict[str, int]) -> None:
    check_elastic_equivalence(recipe, schedule, knob)


@examples(20)
@given(recipe=packing_recipes(finite=True), plan=cut_plans())
def test_packing_modes_checkpoint_at_any_batch_restores_byte_identically(recipe: Recipe, plan: Any) -> None:
    check_cuts_restore_identically(recipe, plan)


@examples(15)
@given(
    recipe=packing_recipes(min_doc_len=1, max_doc_len=10, max_seq_len=6),
    C=st.sampled_from([1, 2, 3]),
    data=st.data(),
    early=st.integers(0, 2),
)
def test_packing_modes_restore_cost_is_independent_of_position(recipe: Recipe, C: int, data: st.DataObject, early: int) -> None:
    lane = data.draw(st.integers(0, C - 1), label="lane")
    S = recipe.shuffle_window or 0
    F = dict(recipe.pack_options).get("window", 0)
    cs = recipe.chunk_size
    # Documents the restore and the next batch can need: a shuffle window refill, the batch and one more window
    # of rows (a row touches at most seq_len + 2 documents), a fit window on either side, and the document after.
    docs = (2 * S + recipe.batch_size) * (recipe.seq_len + 2) + 2 * F + 1
    bound = (math.ceil(docs / cs) + 2) * cs
    late_chunk = bound // cs + 1
    reads_early = _restore_reads(recipe, C, lane, _state_at(recipe, C, lane, batches=early))
    reads_late = _restore_reads(recipe, C, lane, _state_at(recipe, C, lane, min_chunk=late_chunk))
    assert reads_early <= bound, f"restore at batch {early} read {reads_early} documents (bound {bound})"
    assert reads_late <= bound, f"restore at lane chunk >= {late_chunk} read {reads_late} documents (bound {bound})"
