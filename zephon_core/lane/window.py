"""Handing a lane's rows to its batches: in order, or permuted within windows.

Both stages hand out runs of rows together with the lane's ``Cursor`` after
each of them, so the batch that ends at a row carries where to resume.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from zephon_core.batch import Cursor
from zephon_core.curriculum.permutation import IndexPermutation, derive_key
from zephon_core.errors import StateError
from zephon_core.lane.feed import RowFeed
from zephon_core.lane.ops import ShuffleOp
from zephon_core.lane.packing import RowBlock


class RowRun(NamedTuple):
    """Consecutive rows of a lane; ``cursor_after(i)`` is the lane's cursor right after row ``i`` of them."""

    rows: RowBlock
    cursor_after: Callable[[int], Cursor]


class InOrder:
    """The feed's rows as they come; the cursor is the feed's position."""

    def __init__(self, feed: RowFeed, cursor: Cursor) -> None:
        if cursor.delivered_in_window:
            raise StateError(f"lane {feed.lane}: cursor {tuple(cursor)} is inside a shuffle window, but this pipeline has no shuffle")
        self._feed = feed

    def take_run(self) -> RowRun | None:
        """The rows packed so far (at least one; None once the lane has no more)."""
        rows = self._feed.take_ready()
        if rows is None:
            return None
        ends = rows.ends

        def cursor_after(i: int) -> Cursor:
            chunk, document, token = ends[i].tolist()
            return Cursor(chunk, document, token, 0)

        return RowRun(rows, cursor_after)


class ShuffleWindow:
    """The feed's rows permuted within consecutive windows of ``op.window`` rows.

    A window is keyed by the feed position at its start, so refilling it from
    there (a restore) permutes it the same way; the cursor is that position plus
    the rows of the window already handed out.
    """

    def __init__(self, feed: RowFeed, op: ShuffleOp, cursor: Cursor) -> None:
        self._feed = feed
        self._op = op
        self._rows: RowBlock | None = None
        self._base = feed.position  # feed position at the window's start
        self._end = feed.position  # and after its last row
        self._next = 0  # rows of the window handed out
        if cursor.delivered_in_window:
            self._fill()
            size = len(self._rows) if self._rows is not None else 0
            if cursor.delivered_in_window > size:
                raise StateError(f"lane {feed.lane}: cursor says {cursor.delivered_in_window} rows of a window of {size} were delivered")
            self._next = cursor.delivered_in_window

    def _fill(self) -> None:
        self._base = self._feed.position
        rows = self._feed.take(self._op.window)
        if rows is not None and len(rows) > 1:
            key = derive_key("shuffle", self._op.seed, self._feed.lane, *self._base)
            rows = rows.permuted(IndexPermutation(len(rows), key).take(np.arange(len(rows))))
        self._rows = rows
        self._end = self._feed.position
        self._next = 0

    def take_run(self) -> RowRun | None:
        """The rest of the current window (refilled when used up); None once the lane has no more."""
        if self._rows is None or self._next >= len(self._rows):
            self._fill()
            if self._rows is None:
                return None
        size, a = len(self._rows), self._next
        self._next = size
        base, end = self._base, self._end

        def cursor_after(i: int) -> Cursor:
            if a + i + 1 < size:
                return Cursor(base.chunk, base.document, base.token, a + i + 1)
            return Cursor(end.chunk, end.document, end.token, 0)

        return RowRun(self._rows.rows(a, size), cursor_after)
