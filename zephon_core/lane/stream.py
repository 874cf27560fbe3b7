"""One lane's stream: chunks -> pieces -> packed rows -> (shuffled) rows -> batches.

A lane is fully described by its ``Cursor``; ``LaneStream(..., cursor)``
resumes exactly where a stream that reported that cursor stood. Seeking reads
part of one chunk and, with a shuffle, refills one window, so its cost does
not depend on how far the lane had got.

Each stage is its own object (``LaneChunks``, ``PieceReader``, ``RowFeed``,
``InOrder``/``ShuffleWindow``); this one only assembles their rows into batches.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from zephon_core.batch import Batch, Cursor
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.lane.chunks import LaneChunks, LaneQuarantine
from zephon_core.lane.docops import DocOpRunner
from zephon_core.lane.feed import RowFeed
from zephon_core.lane.fit import FitPacker
from zephon_core.lane.ops import FIT_MODES, BatchOp, DocOp, PackOp, ShuffleOp
from zephon_core.lane.packing import ConcatPacker, Packer, PadPacker, Position, RowBlock
from zephon_core.lane.reader import PieceReader
from zephon_core.lane.window import InOrder, ShuffleWindow


class CutRecord(NamedTuple):
    """Batches ``first .. first + batches - 1`` of a lane, ``rows`` rows each: batch ``first + i`` holds the segments
    ``table[bounds[i]:bounds[i + 1]]``. One record per run of rows cut, so what a run of delivered batches held is
    a slice of one table (``pipeline.engine.Deliveries`` counts it), not a NumPy call per batch."""

    first: int
    batches: int
    rows: int
    table: np.ndarray
    bounds: list[int]


def make_packer(pack: PackOp) -> Packer:
    """The packer of a ``pack`` operator: rows of ``seq_len + 1`` tokens (inputs and the label after them)."""
    width = pack.seq_len + 1
    if pack.mode in FIT_MODES:
        assert pack.window is not None
        return FitPacker(width, pack.pad_id, pack.window, pack.mode == "best_fit", pack.overlong == "truncate", pack.max_docs_per_row)
    if pack.mode == "concat" and not pack.max_docs_per_row:
        return ConcatPacker(width, pack.pad_id)
    return PadPacker(width, pack.pad_id, pack.max_docs_per_row, cut=pack.mode == "concat")


def window_end(lane: int, canonical_replicas: int, work_source: WorkSource, doc_ops: Sequence[DocOp], pack: PackOp, window: int,
               start: Position) -> Position:
    """The packer position after ``window`` rows from ``start`` (a shuffle window; 0 for none) and, in a fit mode,
    after the rest of the fit window they end in: what refilling them (a restore) reads."""
    runner = DocOpRunner([replace(op, parallelism=1, runner="thread") for op in doc_ops])
    try:
        packer = make_packer(pack)
        feed = RowFeed(lane, PieceReader(LaneChunks(work_source, lane, canonical_replicas), runner, start, None, 0, packer.headroom), packer, start)
        if window:
            feed.take(window)
        while pack.mode in FIT_MODES and feed.position.token and feed.take(1) is not None:
            pass  # inside a fit window: the whole window was read
        return feed.position
    finally:
        runner.close()


class LaneStream:
    """Produces the batches of one lane, starting from ``cursor`` after ``delivered`` batches."""

    def __init__(
        self,
        lane: int,
        canonical_replicas: int,
        work_source: WorkSource,
        runner: DocOpRunner,
        pack: PackOp,
        shuffle: ShuffleOp | None,
        batch: BatchOp,
        cursor: Cursor,
        delivered: int,
        reader: Executor | None = None,
        readahead: int = 1,
        quarantine: LaneQuarantine | None = None,
    ) -> None:
        self.lane = lane
        self._batch = batch
        start = Position(cursor.chunk, cursor.document, cursor.token)
        packer = make_packer(pack)
        chunks = LaneChunks(work_source, lane, canonical_replicas, quarantine)
        pieces = PieceReader(chunks, runner, start, reader, readahead, packer.headroom)
        feed = RowFeed(lane, pieces, packer, start)
        self._rows = InOrder(feed, cursor) if shuffle is None else ShuffleWindow(feed, shuffle, cursor)
        self._produced = delivered
        self._ready: deque[Batch] = deque()  # cut, not yet handed out
        self.cut_log: deque[CutRecord] = deque()  # what the batches cut hold, for the engine's Deliveries to count
        self._partial: tuple[RowBlock, Cursor] | None = None  # rows short of a batch, and the cursor after them
        self._ended = False

    def next_batch(self) -> Batch | None:
        """The lane's next batch, or None when the lane has ended."""
        while not self._ready:
            if self._ended:
                return None
            self._cut_more()
        return self._ready.popleft()

    def _cut_more(self) -> None:
        """Cut every whole batch out of the next run of rows, starting with the rows held over from the last."""
        B = self._batch.batch_size
        run = self._rows.take_run()
        if run is None:
            self._ended = True
            if self._partial is not None and not self._batch.drop_last:
                rows, cursor = self._partial
                self._emit(rows.tokens, cursor, rows.segments)
            self._partial = None
            return
        rows, at = run.rows, 0  # at: rows of the run already in a batch
        if self._partial is not None:
            held = self._partial[0]
            at = B - len(held)
            if len(rows) < at:
                self._partial = (RowBlock.join([held, rows]), run.cursor_after(len(rows) - 1))
                return
            first = RowBlock.join([held, rows.rows(0, at)])
            self._emit(first.tokens, run.cursor_after(at - 1), first.segments)
            self._partial = None
            rows = rows.rows(at, len(rows))
        n = len(rows) // B
        if n:
            # One pass renumbers the segments of every batch; each batch is then a slice of them.
            segments = rows.segments.copy()
            segments[:, 0] %= B
            cuts = rows.segment_starts()[: n * B + 1 : B].tolist()
            for i in range(n):
                self._emit(rows.tokens[i * B : (i + 1) * B], run.cursor_after(at + (i + 1) * B - 1), segments[cuts[i] : cuts[i + 1]],
                           logged=True)
            self.cut_log.append(CutRecord(self._produced - n, n, B, segments, cuts))
        if n * B < len(rows):
            self._partial = (rows.rows(n * B, len(rows)), run.cursor_after(at + len(rows) - 1))

    def _emit(self, rows: np.ndarray, cursor: Cursor, segments: np.ndarray, logged: bool = False) -> None:
        """Hand out one batch; ``logged``: its caller logs the run it belongs to, with the others cut from it."""
        if not logged:
            self.cut_log.append(CutRecord(self._produced, 1, len(rows), segments, [0, len(segments)]))
        self._ready.append(Batch(rows[:, :-1], rows[:, 1:], lane=self.lane, lane_index=self._produced, cursor=cursor, segments=segments))
        self._produced += 1
