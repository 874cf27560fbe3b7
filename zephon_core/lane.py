"""One lane's stream: chunks -> documents -> packed rows -> shuffled rows -> batches.

A lane is fully described by its ``Cursor``; ``LaneStream(..., cursor)``
resumes exactly where a stream that reported that cursor stood. Seeking reads
one chunk and, with a shuffle, refills one window, so its cost does not depend
on how far the lane had got.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_core.batch import Batch, Cursor, Segment
from zephon_core.errors import DataError, StateError
from zephon_core.execution import DROPPED, DocOpRunner
from zephon_core.mixture import Chunk, StaticMixture
from zephon_core.ops import BatchOp, PackOp, ShuffleOp
from zephon_core.permutation import IndexPermutation, derive_key


@dataclass
class Row:
    tokens: np.ndarray  # [L+1]
    positions: np.ndarray  # [L+1]
    valid: np.ndarray  # [L+1] bool, False on padding
    segments: tuple[Segment, ...]


@dataclass
class ProcessedChunk:
    chunk: Chunk
    docs: list[Any]  # token arrays, or DROPPED


# Chunk descriptors a lane computes at once (see StaticMixture.chunks): a few KB of indices.
# The first call computes only 2, so that a (re)start does not wait for 32.
DESCRIPTOR_BATCH = 32
FIRST_DESCRIPTOR_BATCH = 2


def load_chunk(work_source: StaticMixture, runner: DocOpRunner, global_index: int, chunk: Chunk | None = None, first_doc: int = 0) -> ProcessedChunk | None:
    """Read and process one chunk of the curriculum (None past its end).

    Documents before ``first_doc`` are neither read nor processed (a restored
    lane never goes back before its cursor); their slots hold DROPPED.
    """
    if chunk is None:
        chunk = work_source.chunk(global_index)
    if chunk is None:
        return None
    docs: list[Any] = [None] * len(chunk)
    if first_doc:
        docs[:first_doc] = [DROPPED] * min(first_doc, len(chunk))
    for s in np.unique(chunk.sources[first_doc:]):
        where = np.nonzero(chunk.sources == s)[0]
        where = where[where >= first_doc]
        for j, d in zip(where, work_source.sources[int(s)].read(chunk.documents[where].tolist())):
            docs[int(j)] = d
    if first_doc:
        docs = docs[:first_doc] + runner.run(docs[first_doc:])
    else:
        docs = runner.run(docs)
    for j, d in enumerate(docs):
        if d is DROPPED:
            continue
        if isinstance(d, np.ndarray) and d.ndim == 1 and np.issubdtype(d.dtype, np.integer):
            continue
        if isinstance(d, (list, tuple)):
            docs[j] = np.asarray(d, dtype=np.int64)
            continue
        src = work_source.sources[int(chunk.sources[j])]
        raise DataError(
            f"pack: document {int(chunk.documents[j])} of source {src.name!r} is a {type(d).__name__}, "
            "not token ids; add .tokenize(...) before .pack(...)"
        )
    return ProcessedChunk(chunk, docs)


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
        self._pack = pack
        self._shuffle = shuffle
        self._batch = batch
        self._reader = reader
        self._readahead = max(0, readahead)
        self._futures: dict[int, Future[ProcessedChunk | None]] = {}
        self._descs: dict[int, Chunk | None] = {}
        self._descs_lock = threading.Lock()
        self._descs_batch = FIRST_DESCRIPTOR_BATCH
        self._first = (cursor.chunk, cursor.document)  # the restored chunk is processed from this document on
        self._chunks: dict[int, ProcessedChunk | None] = {}
        self._produced = delivered
        if shuffle is None and cursor.delivered_in_window:
            raise StateError(f"lane {lane}: cursor {tuple(cursor)} is inside a shuffle window, but this pipeline has no shuffle")
        self._pos = (cursor.chunk, cursor.document, cursor.token)
        self._window: list[Row] = []
        self._window_base = self._pos
        self._window_end = self._pos
        self._window_next = 0
        self._ended = False
        self._arange = np.arange(pack.seq_len + 1, dtype=np.int64)
        if shuffle is not None and cursor.delivered_in_window:
            self._fill_window()
            if cursor.delivered_in_window > len(self._window):
                raise StateError(f"lane {lane}: cursor says {cursor.delivered_in_window} rows of a window of {len(self._window)} were delivered")
            self._window_next = cursor.delivered_in_window

    # -- chunks ---------------------------------------------------------------
    def _desc(self, k: int) -> Chunk | None:
        with self._descs_lock:
            if k not in self._descs:
                for old in [c for c in self._descs if c < k]:
                    del self._descs[old]
                ks = range(k, k + self._descs_batch)
                self._descs_batch = DESCRIPTOR_BATCH
                self._descs.update(zip(ks, self._ws.chunks([self.lane + j * self.C for j in ks])))
            return self._descs[k]

    def _load(self, k: int) -> ProcessedChunk | None:
        first_doc = self._first[1] if k == self._first[0] else 0
        return load_chunk(self._ws, self._runner, self.lane + k * self.C, self._desc(k), first_doc)

    def _chunk(self, k: int) -> ProcessedChunk | None:
        if k not in self._chunks:
            for c in list(self._chunks):
                if c < k:
                    del self._chunks[c]
            if self._reader is None:
                self._chunks[k] = self._load(k)
            else:
                for ahead in range(k, k + 1 + self._readahead):
                    if ahead not in self._futures and ahead not in self._chunks:
                        self._futures[ahead] = self._reader.submit(self._load, ahead)
                self._chunks[k] = self._futures.pop(k).result()
        return self._chunks[k]

    def _doc_at(self) -> tuple[np.ndarray, int, int] | None:
        """The document under the packer, normalising the position past ends."""
        start_chunk = self._pos[0]
        while True:
            k, i, t = self._pos
            pc = self._chunk(k)
            if pc is None:
                return None
            if i >= len(pc.docs):
                # Eight epochs' worth of chunks without a token: every document
                # is empty or filtered out (a lone surviving document would have
                # reached this lane with probability above 99.9%). Fail, not hang.
                if k - start_chunk > 8 * self._ws.chunks_per_epoch + 1:
                    raise DataError(
                        f"lane {self.lane}: no tokens in {k - start_chunk} consecutive chunks (eight epochs): "
                        "every document is empty or removed by a filter"
                    )
                self._pos = (k + 1, 0, 0)
                continue
            doc = pc.docs[i]
            if doc is DROPPED or t >= len(doc):
                self._pos = (k, i + 1, 0)
                continue
            return doc, int(pc.chunk.sources[i]), int(pc.chunk.documents[i])

    # -- packing --------------------------------------------------------------
    def _next_row(self) -> Row | None:
        width = self._pack.seq_len + 1
        tokens = np.empty(width, dtype=np.int64)
        positions = np.empty(width, dtype=np.int64)
        arange = self._arange
        filled = 0
        segments: list[Segment] = []
        concat = self._pack.mode == "concat"
        while filled < width:
            cur = self._doc_at()
            if cur is None:
                break
            doc, src, docno = cur
            k, i, t = self._pos
            remaining = len(doc) - t
            space = width - filled
            if remaining <= space:
                take = remaining
            elif concat or filled == 0:
                take = space  # split: concat always does; pad only for a document longer than a row
            else:
                break  # pad mode: the document starts the next row
            tokens[filled : filled + take] = doc[t : t + take]
            positions[filled : filled + take] = arange[:take]
            segments.append(Segment(src, docno, t, t + take))
            filled += take
            self._pos = (k, i, t + take) if t + take < len(doc) else (k, i + 1, 0)
        if filled == 0:
            return None
        valid = np.ones(width, dtype=bool)
        if filled < width:
            tokens[filled:] = self._pack.pad_id
            positions[filled:] = 0
            valid[filled:] = False
        return Row(tokens, positions, valid, tuple(segments))

    # -- shuffling ------------------------------------------------------------
    def _fill_window(self) -> None:
        assert self._shuffle is not None
        self._window_base = self._pos
        rows = []
        for _ in range(self._shuffle.window):
            row = self._next_row()
            if row is None:
                break
            rows.append(row)
        if len(rows) > 1:
            key = derive_key("shuffle", self._shuffle.seed, self.lane, *self._window_base)
            order = IndexPermutation(len(rows), key).take(np.arange(len(rows)))
            rows = [rows[j] for j in order]
        self._window = rows
        self._window_end = self._pos
        self._window_next = 0

    def _next_shuffled(self) -> tuple[Row, Cursor] | None:
        if self._window_next >= len(self._window):
            self._fill_window()
            if not self._window:
                return None
        row = self._window[self._window_next]
        self._window_next += 1
        if self._window_next < len(self._window):
            cursor = Cursor(*self._window_base, self._window_next)
        else:
            cursor = Cursor(*self._window_end, 0)
        return row, cursor

    def _next_row_with_cursor(self) -> tuple[Row, Cursor] | None:
        if self._shuffle is not None:
            return self._next_shuffled()
        row = self._next_row()
        if row is None:
            return None
        return row, Cursor(*self._pos, 0)

    # -- batching -------------------------------------------------------------
    def next_batch(self) -> Batch | None:
        """The lane's next batch, or None when the lane has ended."""
        if self._ended:
            return None
        rows: list[Row] = []
        cursor = None
        while len(rows) < self._batch.batch_size:
            got = self._next_row_with_cursor()
            if got is None:
                break
            rows.append(got[0])
            cursor = got[1]
        if not rows or (len(rows) < self._batch.batch_size and self._batch.drop_last):
            self._ended = True
            return None
        assert cursor is not None
        tokens = np.stack([r.tokens for r in rows])
        positions = np.stack([r.positions for r in rows])
        valid = np.stack([r.valid for r in rows])
        batch = Batch(
            input_ids=tokens[:, :-1],
            labels=tokens[:, 1:],
            positions=positions[:, :-1],
            loss_mask=valid[:, 1:],
            lane=self.lane,
            lane_index=self._produced,
            cursor=cursor,
            provenance=tuple(r.segments for r in rows),
        )
        self._produced += 1
        return batch

