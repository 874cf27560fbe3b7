"""A run's surgery journal (``checkpoint.surgery``) in ``zephon report``: a note for each skip and quarantine, and
the skipped steps taken out of a checkpoint's figures.

A lane counts a skipped batch in its tally as delivered (it cut the batch and moved past it, so step numbers
keep their meaning), but the batch did not train. The tally cannot be split again, so the skipped batches are
cut once more from the run's recipe (``skipped_figures``: only up to the end of the last skip) and their
figures subtracted (``without_skipped``). Batch audit logs need none of this: a skipped batch is never handed
out, so no rank logs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from zephon_core.checkpoint.surgery import SurgeryJournal
from zephon_core.metrics import Tally, sum_tallies
from zephon_core.report.history import History


def journal_notes(journal: SurgeryJournal, left_out: bool) -> list[str]:
    """One note a skip (whether its batches were ``left_out`` of the figures) and one a quarantine."""
    how = ("left out of these figures" if left_out else
           "still counted in these figures (the lanes moved past them): pass the run's --recipe (and its shape) to "
           "leave them out")
    notes = [f"surgery: {s} skipped (journaled): their data did not train, {how}" for s in journal.skips]
    return notes + [f"surgery: quarantined {q} from lane chunks {list(q.from_chunks)} on (journaled)"
                    for q in journal.quarantines]


def skipped_figures(pipeline: Any, journal: SurgeryJournal,
                    delivered: Sequence[Mapping[int, int]]) -> list[tuple[Tally, int]]:
    """For each checkpoint (its lanes' ``delivered`` counts), the figures and number of the batches it counted that
    ``journal`` skipped. ``pipeline`` is the run's, on one group with every lane; it is iterated here."""
    stop = max(s.lane_batches().stop for s in journal.skips)
    skips = journal.skipper()
    assert skips is not None
    reach = {lane: min(stop, max(d.get(lane, 0) for d in delivered)) for m in delivered for lane in m}
    pipeline.surgery = SurgeryJournal((), journal.quarantines)  # cut the skipped batches too, as the lanes cut them
    found: list[tuple[int, int, Tally]] = []
    n_sources = len(pipeline.work_source.sources)
    with pipeline:
        it, seen, owed = iter(pipeline), 0, sum(reach.values())
        while seen < owed:
            b = next(it)
            if b.lane_index >= reach.get(b.lane, 0):
                continue
            seen += 1
            if b.lane_index in skips:
                rows, seq_len = b.input_ids.shape  # a row holds seq_len + 1 tokens (the labels' last one)
                t = Tally(rows=rows, padding=rows * (seq_len + 1))
                t.add_segments([b.segments], b.stage, n_sources)
                found.append((b.lane, b.lane_index, t))
    return [(sum_tallies(t for lane, i, t in found if i < d.get(lane, 0)),
             sum(1 for lane, i, _ in found if i < d.get(lane, 0))) for d in delivered]


def without_skipped(history: History, figures: Sequence[tuple[Tally, int]]) -> History:
    """``history`` (one row a checkpoint) less each checkpoint's skipped figures (``skipped_figures``)."""
    I, S = history.shape  # noqa: E741
    tables = [sum_tallies([t], I, S) for t, _ in figures]

    def less(values: np.ndarray | None, of: Any) -> np.ndarray | None:
        return None if values is None else values - np.array([of(t) for t in tables], dtype=np.int64)

    return dataclasses.replace(
        history,
        tokens=history.tokens - np.array([t.tokens for t in tables], dtype=np.int64),
        documents=history.documents - np.array([t.documents for t in tables], dtype=np.int64),
        batches=history.batches - np.array([n for _, n in figures], dtype=np.int64),
        rows=less(history.rows, lambda t: t.rows),
        padding=less(history.padding, lambda t: t.padding),
        cut=less(history.cut, lambda t: t.cut),
    )
