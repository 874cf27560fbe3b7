"""One lane's stream: chunks -> pieces -> packed rows -> (shuffled) rows -> batches.

A lane is fully described by its ``Cursor``; ``LaneStream(..., cursor)``
resumes exactly where a stream that reported that cursor stood. Seeking reads
part of one chunk and, with a shuffle, refills one window, so its cost does
not depend on how far the lane had got.

Each stage is its own object (``LaneChunks``, ``PieceReader``, ``RowFeed``,
``InOrder``/``ShuffleWindow``); this one only assembles their rows into batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import replace

from zephon_core.batch import Batch, Cursor
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.lane.chunks import LaneChunks
from zephon_core.lane.docops import DocOpRunner
from zephon_core.lane.feed import RowFeed
from zephon_core.lane.ops import BatchOp, DocOp, PackOp, ShuffleOp
from zephon_core.lane.packing import ConcatPacker, PadPacker, Position, RowBlock
from zephon_core.lane.reader import PieceReader
from zephon_core.lane.window import InOrder, ShuffleWindow


def make_packer(pack: PackOp) -> ConcatPacker | PadPacker:
    """The packer of a ``pack`` operator: rows of ``seq_len + 1`` tokens (inputs and the label after them)."""
    width = pack.seq_len + 1
    return ConcatPacker(width, pack.pad_id) if pack.mode == "concat" else PadPacker(width, pack.pad_id)


def window_end(lane: int, canonical_replicas: int, work_source: WorkSource, doc_ops: Sequence[DocOp], pack: PackOp, window: int,
               start: Position) -> Position:
    """The packer position after the shuffle window that starts at ``start``: what refilling it (a restore) reads."""
    runner = DocOpRunner([replace(op, parallelism=1, runner="thread") for op in doc_ops])
    try:
        feed = RowFeed(lane, PieceReader(LaneChunks(work_source, lane, canonical_replicas), runner, start, None, 0), make_packer(pack), start)
        feed.take(window)
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
    ) -> None:
        self.lane = lane
        self._batch = batch
        start = Position(cursor.chunk, cursor.document, cursor.token)
        pieces = PieceReader(LaneChunks(work_source, lane, canonical_replicas), runner, start, reader, readahead)
        feed = RowFeed(lane, pieces, make_packer(pack), start)
        self._rows = InOrder(feed, cursor) if shuffle is None else ShuffleWindow(feed, shuffle, cursor)
        self._produced = delivered
        self._ended = False

    def next_batch(self) -> Batch | None:
        """The lane's next batch, or None when the lane has ended."""
        if self._ended:
            return None
        B = self._batch.batch_size
        parts: list[RowBlock] = []
        have = 0
        cursor = None
        while have < B:
            got = self._rows.take(B - have)
            if got is None:
                break
            part, cursor = got
            parts.append(part)
            have += len(part)
        if not have or (have < B and self._batch.drop_last):
            self._ended = True
            return None
        assert cursor is not None
        rows = RowBlock.join(parts)
        batch = Batch(
            input_ids=rows.tokens[:, :-1],
            labels=rows.tokens[:, 1:],
            positions=rows.positions[:, :-1],
            loss_mask=rows.valid[:, 1:],
            lane=self.lane,
            lane_index=self._produced,
            cursor=cursor,
            segments=rows.segments,
        )
        self._produced += 1
        return batch
