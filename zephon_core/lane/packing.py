"""Packing a lane's documents into rows of ``seq_len + 1`` tokens.

Both packers consume pieces (``zephon_core.lane.pieces``) in lane order and emit
``RowBlock``s: rows as 2-D arrays with their provenance and, for every row,
the packer position right after it. That position is the lane's cursor: a
packer started there produces exactly the rows that followed.

``concat`` rows are consecutive windows of the lane's token stream, so a
whole piece is cut with a handful of NumPy calls. ``pad`` keeps documents
whole (a document longer than a row is split) and is packed document by
document; so is ``concat`` with ``max_docs_per_row`` (``PadPacker(cut=True)``).
The fit modes (``zephon_core.lane.fit``) pack windows of documents.

Every packer is a ``Packer``: the lane stages know only that protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from zephon_core.arrays import gather_index
from zephon_core.lane.pieces import Piece


class Position(NamedTuple):
    """Where a lane's packer stands: the next token it reads."""

    chunk: int  # lane-local chunk number
    document: int  # document within that chunk
    token: int  # tokens of that document already consumed

    @classmethod
    def of(cls, row: np.ndarray) -> Position:
        """A position from one row of a ``RowBlock.ends`` array."""
        chunk, document, token = row.tolist()
        return cls(chunk, document, token)


@dataclass
class RowBlock:
    """Consecutive rows of one lane: their tokens, and where each stretch of a row came from.

    Positions and validity follow from the segments (``zephon_core.batch.row_layout``): a
    block carries neither, and a batch computes them when they are read.
    """

    tokens: np.ndarray  # [n, W] int64
    segments: np.ndarray  # [s, 5] int64 (row, source, document, start, stop), ordered by row
    ends: np.ndarray  # [n, 3] int64, the packer position after each row
    _first: np.ndarray | None = field(default=None, repr=False, compare=False)  # see segment_starts

    def __len__(self) -> int:
        return len(self.tokens)

    def segment_starts(self) -> np.ndarray:
        """``[n + 1]``: row ``r``'s segments are ``segments[s[r]:s[r + 1]]``; found once, as a block is cut into many."""
        if self._first is None:
            self._first = np.searchsorted(self.segments[:, 0], np.arange(len(self) + 1))
        return self._first

    def rows(self, a: int, b: int) -> RowBlock:
        """Rows ``a..b-1`` (views)."""
        if a == 0 and b == len(self):
            return self
        first = self.segment_starts()
        part = self.segments[first[a] : first[b]].copy()
        part[:, 0] -= a
        return RowBlock(self.tokens[a:b], part, self.ends[a:b])

    def permuted(self, order: np.ndarray) -> RowBlock:
        """Row ``j`` of the result is row ``order[j]`` of this block."""
        seg, first = self.segments, self.segment_starts()
        counts = np.diff(first)[order]
        moved = seg[gather_index(first[:-1][order], counts)]
        moved[:, 0] = np.repeat(np.arange(len(order), dtype=np.int64), counts)
        return RowBlock(self.tokens[order], moved, self.ends[order])

    @staticmethod
    def join(blocks: list[RowBlock]) -> RowBlock:
        if len(blocks) == 1:
            return blocks[0]
        shifted = []
        base = 0
        for b in blocks:
            seg = b.segments.copy()
            seg[:, 0] += base
            shifted.append(seg)
            base += len(b)
        return RowBlock(np.concatenate([b.tokens for b in blocks]), np.concatenate(shifted), np.concatenate([b.ends for b in blocks]))


class Packer(Protocol):
    """What the lane stages (``RowFeed``) ask of a packer.

    ``seek(start)`` is called once, before the first ``feed``: it returns where
    reading starts (``start`` itself, except for a packer whose positions say
    more than where the next token is, like a fit window's rows already out).
    ``feed`` packs documents ``j..`` of a piece (from token ``t`` of ``j``) and
    returns the rows they complete; ``flush`` the rest at the end of the data.
    """

    @property
    def headroom(self) -> int:
        """Tokens of free room a piece needs in front of its first document."""
        ...

    def seek(self, start: Position) -> Position:
        return start

    def feed(self, piece: Piece, j: int, t: int) -> RowBlock | None: ...

    def flush(self, end: Position) -> RowBlock | None: ...


def _sorted_union(doc_starts: np.ndarray, row_starts: np.ndarray) -> np.ndarray:
    """0 and the values of two ascending arrays, ascending, each once (``np.unique`` hashes; this is a sort of few values)."""
    a = np.concatenate([np.zeros(1, dtype=np.int64), doc_starts, row_starts])
    a.sort()
    keep = np.empty(len(a), dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def _piece_stream(piece: Piece, j: int, t: int) -> tuple[int, np.ndarray, np.ndarray]:
    """Where documents ``j..`` of a piece start in ``piece.tokens`` from token ``t`` of ``j``; each one's start and length from there."""
    base = int(piece.offsets[j]) + t
    starts = piece.offsets[j:-1] - base  # the first document starts at -t: t tokens of it were read before
    lengths = piece.offsets[j + 1 :] - piece.offsets[j:-1]
    return base, starts, lengths


class ConcatPacker(Packer):
    """Rows are consecutive ``width``-token windows of the lane's token stream.

    A row block's tokens are a view of the piece they were cut from: the open row
    carried over from the last piece is written into the new piece's headroom
    (``Piece.headroom``), right before its first document, so no token is copied
    after it was read.
    """

    def __init__(self, width: int, pad_id: int) -> None:
        self.width = width
        self.pad_id = pad_id
        self._carry_tokens = np.zeros(0, dtype=np.int64)  # the open row
        self._carry_segments = np.zeros((0, 4), dtype=np.int64)  # source, document, start, stop

    @property
    def headroom(self) -> int:
        """Tokens of headroom a piece needs in front so that rows are cut from it without a copy."""
        return self.width - 1

    def feed(self, piece: Piece, j: int, t: int) -> RowBlock | None:
        """Pack documents ``j..`` of ``piece`` (from token ``t`` of ``j``): the rows they complete, if any.

        The piece is consumed: its headroom may be overwritten, and the rows are views of it.
        """
        W = self.width
        base, starts, lengths = _piece_stream(piece, j, t)
        S = len(piece.tokens) - base
        if S <= 0:
            return None
        stream = piece.tokens[base:]
        c = len(self._carry_tokens)
        n_rows = (c + S) // W
        used = n_rows * W - c  # stream tokens in complete rows; the rest opens the next row

        # Segments start at every document start and every row start inside the stream;
        # the stream's first token always starts one (a document, or the row after a cut).
        row_starts = np.arange(W - c, S, W, dtype=np.int64)
        doc_starts = starts[np.searchsorted(starts, 0, side="right") : np.searchsorted(starts, S)]  # starts ascend
        bounds = _sorted_union(doc_starts, row_starts)
        seg = self._segment_table(piece, j, starts, bounds, S, c)
        if not n_rows:
            self._carry_tokens = np.concatenate([self._carry_tokens, stream])
            self._carry_segments = seg[:, 1:]
            return None

        in_rows = len(self._carry_segments) + int(np.searchsorted(bounds, used))  # segments starting before the open row
        if c == 0:
            tokens = stream[:used]
        elif j == 0 and t == 0 and c <= piece.headroom:
            piece.tokens[base - c : base] = self._carry_tokens
            tokens = piece.tokens[base - c : base + used]
        else:
            tokens = np.concatenate([self._carry_tokens, stream[:used]])

        # The packer position after each row: right after its last token.
        last = np.arange(1, n_rows + 1, dtype=np.int64) * W - c - 1
        d = np.searchsorted(starts, last, side="right") - 1
        taken = last + 1 - starts[d]
        done = taken >= lengths[d]
        ends = np.empty((n_rows, 3), dtype=np.int64)
        ends[:, 0] = piece.chunk[j + d]
        ends[:, 1] = piece.index[j + d] + done
        ends[:, 2] = np.where(done, 0, taken)

        self._carry_tokens = stream[used:]
        self._carry_segments = seg[in_rows:, 1:]
        return RowBlock(tokens.reshape(n_rows, W), seg[:in_rows], ends)

    def _segment_table(self, piece: Piece, j: int, starts: np.ndarray, bounds: np.ndarray, S: int, c: int) -> np.ndarray:
        """The segments of the open row, then one per ``bounds`` of the stream, each with its row."""
        seg_len = np.empty_like(bounds)
        np.subtract(bounds[1:], bounds[:-1], out=seg_len[:-1])
        seg_len[-1] = S - bounds[-1]
        doc = np.searchsorted(starts, bounds, side="right") - 1  # the last document starting there: skips empty ones
        seg_start = bounds - starts[doc]
        which = j + doc
        nc = len(self._carry_segments)
        seg = np.empty((nc + len(bounds), 5), dtype=np.int64)
        seg[:nc, 0] = 0
        seg[:nc, 1:] = self._carry_segments
        fresh = seg[nc:]
        fresh[:, 0] = (bounds + c) // self.width
        fresh[:, 1] = piece.sources[which]
        fresh[:, 2] = piece.documents[which]
        fresh[:, 3] = seg_start
        np.add(seg_start, seg_len, out=fresh[:, 4])
        return seg

    def flush(self, end: Position) -> RowBlock | None:
        """The open row padded to ``width``, at the end of the data (None if it is empty)."""
        block = _padded_row(self._carry_tokens, self._carry_segments, self.width, self.pad_id, end)
        self._carry_tokens = self._carry_tokens[:0]
        self._carry_segments = self._carry_segments[:0]
        return block


def _padded_row(tokens: np.ndarray, segments: np.ndarray, width: int, pad_id: int, end: Position) -> RowBlock | None:
    c = len(tokens)
    if c == 0:
        return None
    row = np.full((1, width), pad_id, dtype=np.int64)
    row[0, :c] = tokens
    segs = np.column_stack([np.zeros(len(segments), dtype=np.int64), segments])
    return RowBlock(row, segs, np.asarray([end], dtype=np.int64))


class PadPacker(Packer):
    """Rows of whole documents, padded; a document longer than a row is split across rows.

    A row closes once it holds ``max_docs`` stretches of documents (0: no limit). With
    ``cut`` a document that does not fit is cut across rows instead (``concat`` with
    ``max_docs_per_row``: rows fill up unless the document limit closes them first).
    """

    headroom = 0  # rows are built token by token: a piece needs no room in front

    def __init__(self, width: int, pad_id: int, max_docs: int = 0, cut: bool = False) -> None:
        self.width = width
        self.pad_id = pad_id
        self._max_docs = max_docs
        self._cut = cut
        self._parts: list[np.ndarray] = []  # the open row's tokens
        self._segments: list[tuple[int, int, int, int]] = []
        self._filled = 0
        self._closed: list[tuple[list[np.ndarray], list[tuple[int, int, int, int]], Position]] = []

    def _close(self, end: Position) -> None:
        self._closed.append((self._parts, self._segments, end))
        self._parts, self._segments, self._filled = [], [], 0

    def feed(self, piece: Piece, j: int, t: int) -> RowBlock | None:
        """Pack documents ``j..`` of ``piece`` (from token ``t`` of ``j``): the rows they complete, if any."""
        W = self.width
        base, starts, lengths = _piece_stream(piece, j, t)
        stream = piece.tokens[base:]
        for d, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist())):
            k, i = int(piece.chunk[j + d]), int(piece.index[j + d])
            src, docno = int(piece.sources[j + d]), int(piece.documents[j + d])
            consumed = t if d == 0 else 0
            while consumed < length:
                remaining, space = length - consumed, W - self._filled
                if remaining > space and self._filled and not self._cut:
                    self._close(Position(k, i, consumed))  # the document starts the next row
                    continue
                take = min(remaining, space)
                at = start + consumed
                self._parts.append(stream[at : at + take])
                self._segments.append((src, docno, consumed, consumed + take))
                self._filled += take
                consumed += take
                if self._filled == W or len(self._segments) == self._max_docs:
                    self._close(Position(k, i, consumed) if consumed < length else Position(k, i + 1, 0))
        return self._emit()

    def flush(self, end: Position) -> RowBlock | None:
        """The open row padded to ``width``, at the end of the data (None if it is empty)."""
        if self._filled:
            self._close(end)
        return self._emit()

    def _emit(self) -> RowBlock | None:
        if not self._closed:
            return None
        n, W = len(self._closed), self.width
        tokens = np.full((n, W), self.pad_id, dtype=np.int64)
        segments: list[tuple[int, ...]] = []
        for r, (parts, segs, _) in enumerate(self._closed):
            at = 0
            for part in parts:
                tokens[r, at : at + len(part)] = part
                at += len(part)
            segments.extend((r, *s) for s in segs)
        ends = np.asarray([end for _, _, end in self._closed], dtype=np.int64)
        self._closed = []
        seg = np.asarray(segments, dtype=np.int64).reshape(-1, 5)
        return RowBlock(tokens, seg, ends)
