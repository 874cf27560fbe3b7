"""A lane's packed rows, in order: pieces through the packer, handed out a few at a time."""

from __future__ import annotations

import numpy as np

from zephon_core.errors import DataError
from zephon_core.lane.packing import Packer, Position, RowBlock
from zephon_core.lane.reader import PieceReader
from zephon_core.metrics import COUNTERS


class RowFeed:
    """The rows of one lane from ``start`` on.

    ``position`` is the packer position after the last row taken: a feed
    started there hands out exactly the rows that followed.
    """

    def __init__(self, lane: int, reader: PieceReader, packer: Packer, start: Position) -> None:
        self.lane = lane
        self._reader = reader
        self._packer = packer
        self._read_pos = packer.seek(start)  # the next token the packer reads
        self._token_chunk = self._read_pos.chunk  # the last chunk that had a token
        self._data_ended = False
        self._blocks: list[RowBlock] = []  # packed rows not yet taken
        self._head_taken = 0  # rows of the first block already taken
        self.position = start

    def take(self, n: int) -> RowBlock | None:
        """Up to ``n`` packed rows, in order (None once the lane has no more)."""
        parts: list[RowBlock] = []
        need = n
        while need:
            if not self._blocks and not self._pack_more():
                break
            head, at = self._blocks[0], self._head_taken
            got = min(need, len(head) - at)
            parts.append(head.rows(at, at + got))
            need -= got
            if at + got == len(head):
                self._blocks.pop(0)
                self._head_taken = 0
            else:
                self._head_taken = at + got
        if not parts:
            return None
        block = RowBlock.join(parts)
        self.position = Position.of(block.ends[-1])
        return block

    def take_ready(self) -> RowBlock | None:
        """The rows packed and not yet taken (packing more if there are none), None once the lane has no more."""
        if not self._blocks and not self._pack_more():
            return None
        block = self._blocks.pop(0)
        if self._head_taken:
            block = block.rows(self._head_taken, len(block))
            self._head_taken = 0
        self.position = Position.of(block.ends[-1])
        return block

    def _pack_more(self) -> bool:
        """Pack until at least one more row exists; False once the data has ended and every row is out."""
        if self._data_ended:
            return False
        while True:
            k, i, t = self._read_pos
            key = self._reader.key(k, i)
            if key is None:
                if self._reader.chunks[k] is not None:  # past this chunk's last document
                    self._check_progress(k)
                    self._read_pos = Position(k + 1, 0, 0)
                    continue
                self._data_ended = True
                block = self._packer.flush(self._read_pos)
                if block is None:
                    return False
                self._blocks.append(block)
                return True
            piece = self._reader.read(key)
            j = i - key.lo
            offsets = piece.offsets
            if len(offsets) > 1 and offsets[-1] > offsets[-2] and (len(offsets) - 2 > j or offsets[-1] - offsets[-2] > t):
                self._token_chunk = int(piece.chunk[-1])  # the common case: the last document has tokens to read
            else:
                nonempty = np.flatnonzero(np.diff(offsets[j:]) > 0)
                if len(nonempty) and (nonempty[-1] > 0 or offsets[j + 1] - offsets[j] > t):
                    self._token_chunk = int(piece.chunk[j + nonempty[-1]])
            with COUNTERS.timed("pack_s"):
                block = self._packer.feed(piece, j, t)
            self._read_pos = self._reader.end_of(key)
            if block is not None:
                self._blocks.append(block)
                return True

    def _check_progress(self, k: int) -> None:
        # Eight epochs' worth of chunks without a token: every document is empty or
        # filtered out (a lone surviving document would have reached this lane with
        # probability above 99.9%). Fail, not hang.
        if k - self._token_chunk > 8 * self._reader.chunks.per_epoch + 1:
            raise DataError(
                f"lane {self.lane}: no tokens in {k - self._token_chunk} consecutive chunks (eight epochs): "
                "every document is empty or removed by a filter"
            )
