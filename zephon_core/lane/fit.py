"""Packing windows of documents into rows by a fit rule (``pack(mode="best_fit" | "first_fit")``).

A *fit window* is ``window`` consecutive documents of the lane (empty and
filtered-out ones count: they keep their slot), starting at a document. Its
documents are cut into items of at most a row (``overlong="split"``: pieces
of a row each; ``"truncate"``: the first row's worth, the rest dropped and
accounted), items are placed longest first (ties in lane order) into rows by
the rule — ``first_fit``: the first row, in creation order, with room;
``best_fit``: the row with the least room that fits — and the rows come out in
creation order. A row holds at most ``max_docs`` stretches of documents.

Nothing of one window reaches into the next, so a window is a pure function
of the documents from its start on. The position after a row inside a window
is ``(chunk, document, r)`` of the window's first document with ``r`` the
window's rows already out (the position's token slot: a window starts at a
document, so it has no token to name); after a window's last row it is the
next window's first document, ``(chunk, document, 0)``. A packer started there
(``seek``) reads from the window's first document and skips ``r`` rows: a
restore repacks at most one window. A truncated document leaves a marker
segment ``(row, source, document, L, L)`` (``L`` its length) right after the
stretch kept, so a tally counts the dropped tokens from the segments alone.
"""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np

from zephon_core.errors import StateError
from zephon_core.lane.packing import Packer, Position, RowBlock
from zephon_core.lane.pieces import Piece

# A document held in a window: lane chunk, document in it, source, document in the source, tokens.
_Doc = tuple[int, int, int, int, np.ndarray]


def place(lengths: list[int], width: int, best: bool, max_docs: int) -> list[int]:
    """The row of each item, placed in the order given: the first row with room, or (``best``) the fullest with room.

    A new row opens when none has room (or all that have hold ``max_docs`` items).
    """
    if best:
        return _best_fit(lengths, width, max_docs)
    smallest = min(lengths, default=0)
    open_rows: list[int] = []  # rows that can take another item, in the order they were opened
    room: list[int] = []
    held: list[int] = []
    where = []
    for length in lengths:
        k = next((k for k, r in enumerate(open_rows) if room[r] >= length), -1)
        if k < 0:
            k, r = len(open_rows), len(room)
            open_rows.append(r)
            room.append(width)
            held.append(0)
        else:
            r = open_rows[k]
        room[r] -= length
        held[r] += 1
        if room[r] < smallest or held[r] == max_docs:  # no item of this window fits it any more
            del open_rows[k]
        where.append(r)
    return where


def _best_fit(lengths: list[int], width: int, max_docs: int) -> list[int]:
    """Best fit: the open row with the least room that fits (ties: the first opened); rows sorted by (room, row)."""
    open_rows: list[tuple[int, int]] = []  # rows that can take another item
    held: list[int] = []
    where = []
    for length in lengths:
        k = bisect_left(open_rows, (length, -1))
        if k < len(open_rows):
            room, r = open_rows.pop(k)
        else:
            room, r = width, len(held)
            held.append(0)
        room -= length
        held[r] += 1
        if room and held[r] != max_docs:
            insort(open_rows, (room, r))
        where.append(r)
    return where


class FitPacker(Packer):
    """Rows of ``width`` tokens from fit windows of ``window`` documents (module docstring)."""

    headroom = 0  # rows are built item by item: a piece needs no room in front

    def __init__(self, width: int, pad_id: int, window: int, best: bool, truncate: bool = False, max_docs: int = 0) -> None:
        self.width = width
        self.pad_id = pad_id
        self._window = window
        self._best = best
        self._truncate = truncate
        self._max_docs = max_docs
        self._docs: list[_Doc] = []  # read, not yet in a packed window
        self._skip = 0  # rows of the first window already delivered before a restore

    def seek(self, start: Position) -> Position:
        """Read from the window's first document; its first ``start.token`` rows were delivered already."""
        self._skip = start.token
        return Position(start.chunk, start.document, 0)

    def feed(self, piece: Piece, j: int, t: int) -> RowBlock | None:
        """Hold documents ``j..`` of ``piece``; pack every window that is complete and followed by a document."""
        if t:
            raise StateError(f"fit packing reads whole documents: cannot start {t} tokens into document {int(piece.index[j])}")
        off = piece.offsets.tolist()
        chunk, index, src, doc = (a.tolist() for a in (piece.chunk, piece.index, piece.sources, piece.documents))
        tokens = piece.tokens
        self._docs.extend((chunk[d], index[d], src[d], doc[d], tokens[off[d] : off[d + 1]]) for d in range(j, len(chunk)))
        blocks = []
        W = self._window
        while len(self._docs) > W:
            k, i = self._docs[W][:2]
            block = self._pack(self._docs[:W], Position(k, i, 0))
            del self._docs[:W]
            if block is not None:
                blocks.append(block)
        return RowBlock.join(blocks) if blocks else None

    def flush(self, end: Position) -> RowBlock | None:
        """The last window's rows, at the end of the data."""
        docs, self._docs = self._docs, []
        return self._pack(docs, end) if docs else None

    def _items(self, docs: list[_Doc]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The window's items (document in window, start, stop), longest first (ties in lane order); the documents' lengths."""
        W = self.width
        L = np.fromiter((len(d[4]) for d in docs), dtype=np.int64, count=len(docs))
        stop = np.minimum(L, W) if self._truncate else L
        pieces = -(-stop // W)
        doc = np.repeat(np.arange(len(docs), dtype=np.int64), pieces)
        a = (np.arange(len(doc), dtype=np.int64) - np.repeat(np.cumsum(pieces) - pieces, pieces)) * W
        b = np.minimum(a + W, stop[doc])
        order = np.argsort(a - b, kind="stable")
        return doc[order], a[order], b[order], L

    def _pack(self, docs: list[_Doc], end: Position) -> RowBlock | None:
        """One window's rows (less the rows to skip after a restore), or None if it has no tokens."""
        doc, a, b, L = self._items(docs)
        skip, self._skip = self._skip, 0
        if not len(doc):
            if skip:
                raise StateError(f"cursor says {skip} rows of a fit window were delivered, but the window has none")
            return None
        lengths = b - a
        row = np.asarray(place(lengths.tolist(), self.width, self._best, self._max_docs), dtype=np.int64)
        R = int(row.max()) + 1
        if skip >= R:
            raise StateError(f"cursor says {skip} rows of a fit window of {R} rows were delivered")
        # Items grouped by row, in the order they were placed: where each lands in its row, and comes from.
        by_row = np.argsort(row, kind="stable")
        doc, a, b, row, n = doc[by_row], a[by_row], b[by_row], row[by_row], lengths[by_row]
        before = np.cumsum(n) - n
        before -= before[np.searchsorted(row, np.arange(R))][row]  # tokens of the row before the item
        flat = np.full(R * self.width, self.pad_id, dtype=np.int64)
        # One slice copy per item: a window has about as many items as documents, and per-token
        # index arrays (a gather and a scatter) cost several times the copy itself.
        for d, x, y, at in zip(doc.tolist(), a.tolist(), b.tolist(), (row * self.width + before).tolist()):
            flat[at : at + y - x] = docs[d][4][x:y]
        seg = np.column_stack([row, np.fromiter((d[2] for d in docs), np.int64, len(docs))[doc],
                               np.fromiter((d[3] for d in docs), np.int64, len(docs))[doc], a, b])
        if self._truncate:
            dropped = np.flatnonzero(b < L[doc])  # the rest of these documents was dropped: a marker after each
            if len(dropped):
                marks = seg[dropped].copy()
                marks[:, 3] = marks[:, 4] = L[doc[dropped]]
                seg = np.insert(seg, dropped + 1, marks, axis=0)
        k, i = docs[0][:2]
        ends = np.array([(k, i, r + 1) for r in range(R)], dtype=np.int64)
        ends[-1] = end
        block = RowBlock(flat.reshape(R, self.width), seg, ends)
        return block.rows(skip, R) if skip else block
