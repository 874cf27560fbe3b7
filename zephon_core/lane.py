"""One lane's stream: chunks -> pieces -> packed rows -> shuffled rows -> batches.

A lane is fully described by its ``Cursor``; ``LaneStream(..., cursor)``
resumes exactly where a stream that reported that cursor stood. Seeking reads
part of one chunk and, with a shuffle, refills one window, so its cost does
not depend on how far the lane had got.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor, Future
from typing import Union

import numpy as np

from zephon_core.batch import Batch, Cursor
from zephon_core.errors import DataError, StateError
from zephon_core.execution import DocOpRunner
from zephon_core.mixture import Chunk, StaticMixture
from zephon_core.ops import BatchOp, PackOp, ShuffleOp
from zephon_core.packing import ConcatPacker, PadPacker, Position, RowBlock
from zephon_core.permutation import IndexPermutation, derive_key
from zephon_core.pieces import Piece, load_piece, slice_bounds

# Chunk descriptors a lane computes at once (see StaticMixture.chunks): a few KB of indices.
# The first call computes only 2, so that a (re)start does not wait for 32.
DESCRIPTOR_BATCH = 32
FIRST_DESCRIPTOR_BATCH = 2

# Without per-document operators, and from pretokenized sources, a piece after the first
# spans whole chunks up to this many documents, so that cutting rows costs a few NumPy
# calls per many batches.
PIECE_DOCS = 512

PieceKey = tuple[int, int, int, int]  # lane chunk, its first document, its end document, whole chunks after it


class LaneStream:
    """Produces the batches of one lane, starting from ``cursor``."""

    def __init__(
        self,
        lane: int,
        canonical_replicas: int,
        work_source: StaticMixture,
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
        self.C = canonical_replicas
        self._ws = work_source
        self._runner = runner
        self._shuffle = shuffle
        self._batch = batch
        self._reader = reader
        self._readahead = max(0, readahead)
        self._futures: dict[PieceKey, Future[Piece]] = {}
        self._descs: dict[int, Chunk | None] = {}
        self._descs_lock = threading.Lock()
        self._descs_batch = FIRST_DESCRIPTOR_BATCH
        self._first = (cursor.chunk, cursor.document)  # this chunk is read in slices, from this document on
        self._flat = all(callable(getattr(s, "read_flat", None)) for s in work_source.sources)
        self._produced = delivered
        if shuffle is None and cursor.delivered_in_window:
            raise StateError(f"lane {lane}: cursor {tuple(cursor)} is inside a shuffle window, but this pipeline has no shuffle")
        width = pack.seq_len + 1
        self._packer: Union[ConcatPacker, PadPacker] = (
            ConcatPacker(width, pack.pad_id) if pack.mode == "concat" else PadPacker(width, pack.pad_id)
        )
        self._read_pos: Position = (cursor.chunk, cursor.document, cursor.token)  # next token the packer reads
        self._token_chunk = cursor.chunk  # the last chunk that had a token
        self._data_ended = False
        self._blocks: list[RowBlock] = []  # packed rows not yet taken
        self._head_taken = 0  # rows of the first block already taken
        self._row_pos: Position = self._read_pos  # packer position after the last row taken
        self._window: RowBlock | None = None
        self._window_base = self._row_pos
        self._window_end = self._row_pos
        self._window_next = 0
        self._ended = False
        if shuffle is not None and cursor.delivered_in_window:
            self._fill_window()
            size = len(self._window) if self._window is not None else 0
            if cursor.delivered_in_window > size:
                raise StateError(f"lane {lane}: cursor says {cursor.delivered_in_window} rows of a window of {size} were delivered")
            self._window_next = cursor.delivered_in_window

    # -- chunks and pieces ----------------------------------------------------
    def _desc(self, k: int) -> Chunk | None:
        with self._descs_lock:
            if k not in self._descs:
                for old in [c for c in self._descs if c < k - DESCRIPTOR_BATCH]:
                    del self._descs[old]
                ks = range(k, k + self._descs_batch)
                self._descs_batch = DESCRIPTOR_BATCH
                self._descs.update(zip(ks, self._ws.chunks([self.lane + j * self.C for j in ks])))
            return self._descs[k]

    def _piece_key(self, k: int, i: int) -> PieceKey | None:
        """The piece holding document ``i`` of lane chunk ``k`` (None past the end of the data or of the chunk)."""
        desc = self._desc(k)
        if desc is None or i >= len(desc):
            return None
        if not self._runner.ops:
            # The first chunk alone (a restore reads no more than it needs), then several
            # chunks at once where sources hand over flat token arrays.
            extra, docs = 0, len(desc) - i
            while docs < PIECE_DOCS and k != self._first[0] and self._flat:
                nxt = self._desc(k + extra + 1)
                if nxt is None or docs + len(nxt) > PIECE_DOCS:
                    break
                extra, docs = extra + 1, docs + len(nxt)
            return k, i, len(desc), extra
        if k == self._first[0] and i >= self._first[1]:
            lo, hi = slice_bounds(len(desc), self._first[1], i)
        else:
            lo, hi = 0, len(desc)
        return k, lo, hi, 0

    def _is_slice(self, key: PieceKey) -> bool:
        return bool(self._runner.ops) and key[0] == self._first[0]

    def _end_of(self, key: PieceKey) -> Position:
        """The packer position right after a piece."""
        k, _, hi, extra = key
        if not extra:
            return k, hi, 0
        last = self._desc(k + extra)
        assert last is not None
        return k + extra, len(last), 0

    def _following(self, key: PieceKey) -> PieceKey | None:
        k, i, _ = self._end_of(key)
        nxt = self._piece_key(k, i)
        if nxt is None and self._desc(k + 1) is not None:
            nxt = self._piece_key(k + 1, 0)
        return nxt

    def _load(self, key: PieceKey) -> Piece:
        k, lo, hi, extra = key
        parts = []
        for e in range(extra + 1):
            desc = self._desc(k + e)
            assert desc is not None
            parts.append((k + e, desc, lo if e == 0 else 0, hi if e == 0 else len(desc)))
        return load_piece(self._ws, self._runner, parts)

    def _piece(self, key: PieceKey) -> Piece:
        for stale in [f for f in self._futures if f[:2] < key[:2]]:
            self._futures.pop(stale).cancel()
        # The first chunk's slices are read here, without read-ahead: after a restore the
        # first batch would otherwise share the CPU with documents it does not need.
        if self._reader is None or self._is_slice(key):
            return self._load(key)
        ahead: PieceKey | None = key
        for _ in range(1 + self._readahead):
            if ahead is None:
                break
            if ahead not in self._futures:
                self._futures[ahead] = self._reader.submit(self._load, ahead)
            ahead = self._following(ahead)
        return self._futures.pop(key).result()

    # -- packing --------------------------------------------------------------
    def _pack_more(self) -> bool:
        """Pack until at least one more row exists; False once the data has ended and every row is out."""
        if self._data_ended:
            return False
        while True:
            k, i, t = self._read_pos
            key = self._piece_key(k, i)
            if key is None:
                if self._desc(k) is not None:  # past this chunk's last document
                    # Eight epochs' worth of chunks without a token: every document is empty or
                    # filtered out (a lone surviving document would have reached this lane with
                    # probability above 99.9%). Fail, not hang.
                    if k - self._token_chunk > 8 * self._ws.chunks_per_epoch + 1:
                        raise DataError(
                            f"lane {self.lane}: no tokens in {k - self._token_chunk} consecutive chunks (eight epochs): "
                            "every document is empty or removed by a filter"
                        )
                    self._read_pos = (k + 1, 0, 0)
                    continue
                self._data_ended = True
                block = self._packer.flush(self._read_pos)
                if block is None:
                    return False
                self._blocks.append(block)
                return True
            piece = self._piece(key)
            j = i - key[1]
            nonempty = np.flatnonzero(np.diff(piece.offsets[j:]) > 0)
            if len(nonempty) and (nonempty[-1] > 0 or piece.offsets[j + 1] - piece.offsets[j] > t):
                self._token_chunk = int(piece.chunk[j + nonempty[-1]])
            block = self._packer.feed(piece, j, t)
            self._read_pos = self._end_of(key)
            if block is not None:
                self._blocks.append(block)
                return True

    def _take_rows(self, n: int) -> RowBlock | None:
        """Up to ``n`` packed rows, in order (None once the lane has no more)."""
        parts: list[RowBlock] = []
        need = n
        while need:
            if not self._blocks and not self._pack_more():
                break
            head, at = self._blocks[0], self._head_taken
            take = min(need, len(head) - at)
            parts.append(head.rows(at, at + take))
            need -= take
            if at + take == len(head):
                self._blocks.pop(0)
                self._head_taken = 0
            else:
                self._head_taken = at + take
        if not parts:
            return None
        block = RowBlock.join(parts)
        end = block.ends[-1]
        self._row_pos = (int(end[0]), int(end[1]), int(end[2]))
        return block

    # -- shuffling ------------------------------------------------------------
    def _fill_window(self) -> None:
        assert self._shuffle is not None
        self._window_base = self._row_pos
        rows = self._take_rows(self._shuffle.window)
        if rows is not None and len(rows) > 1:
            key = derive_key("shuffle", self._shuffle.seed, self.lane, *self._window_base)
            rows = rows.permuted(IndexPermutation(len(rows), key).take(np.arange(len(rows))))
        self._window = rows
        self._window_end = self._row_pos
        self._window_next = 0

    def _next_shuffled(self, n: int) -> tuple[RowBlock, Cursor] | None:
        """Up to ``n`` rows of the current window (refilled when used up) and the cursor after them."""
        if self._window is None or self._window_next >= len(self._window):
            self._fill_window()
            if self._window is None:
                return None
        size = len(self._window)
        a = self._window_next
        b = min(size, a + n)
        self._window_next = b
        cursor = Cursor(*self._window_base, b) if b < size else Cursor(*self._window_end, 0)
        return self._window.rows(a, b), cursor

    # -- batching -------------------------------------------------------------
    def next_batch(self) -> Batch | None:
        """The lane's next batch, or None when the lane has ended."""
        if self._ended:
            return None
        B = self._batch.batch_size
        parts: list[RowBlock] = []
        have = 0
        cursor = None
        while have < B:
            if self._shuffle is not None:
                got = self._next_shuffled(B - have)
                if got is None:
                    break
                part, cursor = got
            else:
                taken = self._take_rows(B - have)
                if taken is None:
                    break
                part, cursor = taken, Cursor(*self._row_pos, 0)
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
