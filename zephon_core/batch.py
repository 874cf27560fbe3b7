"""The unit a pipeline delivers: one batch of packed rows from one lane."""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import numpy as np


class Segment(NamedTuple):
    """Where the tokens of one stretch of a row came from."""

    source: int  # source number in the work source
    document: int  # document number within that source
    start: int  # first token of the document in this stretch
    stop: int  # one past the last


class Cursor(NamedTuple):
    """A lane's position: everything needed to seek it.

    ``(chunk, document, token)`` is the packer's position — lane-local chunk
    number, document within the chunk, tokens of it already consumed — at the
    start of the current shuffle window (after the last row when there is no
    shuffle); ``delivered_in_window`` counts rows of that window already out.
    In the fit packing modes a position inside a fit window is its first document,
    with ``token`` counting the rows of that window already out (``zephon_core.lane.fit``).
    """

    chunk: int
    document: int
    token: int
    delivered_in_window: int

    @classmethod
    def start(cls) -> Cursor:
        return cls(0, 0, 0, 0)

    @property
    def last_chunk(self) -> int:
        """The lane chunk the lane stands in (the one before, when it stands at a chunk's very start)."""
        return self.chunk if (self.document or self.token) else max(self.chunk - 1, 0)


def row_layout(segments: np.ndarray, n_rows: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``[n_rows, width]`` (int64) and validity (bool) of packed rows, from their segments.

    A row's segments (``(row, source, document, start, stop)``, ordered by row)
    fill it from its first token on; the rest is padding. A position counts
    tokens from the start of its segment, so it restarts at 0 at every row and
    document boundary, and is 0 on padding.
    """
    seg = segments[segments[:, 4] > segments[:, 3]] if len(segments) else segments
    rows, lengths = seg[:, 0], seg[:, 4] - seg[:, 3]
    filled = np.zeros(len(seg) + 1, dtype=np.int64)
    np.cumsum(lengths, out=filled[1:])
    row_base = filled[np.searchsorted(rows, np.arange(n_rows + 1))]  # tokens of the rows before each row
    begin = rows * width + (filled[:-1] - row_base[rows])  # flat index of each segment's first token
    marks = np.zeros(n_rows * width, dtype=np.int64)
    marks[begin] = begin
    np.maximum.accumulate(marks, out=marks)
    positions = (np.arange(n_rows * width, dtype=np.int64) - marks).reshape(n_rows, width)
    valid = np.arange(width) < np.diff(row_base)[:, None]
    if not valid.all():
        positions[~valid] = 0
    return positions, valid


class Batch:
    """Rows ``[B, L]`` as NumPy arrays (``torch.from_numpy`` shares them); immutable.

    ``labels`` are ``input_ids`` shifted by one; ``loss_mask`` is False where
    the label is padding; ``positions`` restart at 0 at each row and document
    boundary. ``segments`` holds one ``(row, source, document, start, stop)``
    line per stretch of a row, ordered by row; ``provenance[r]`` lists row
    ``r``'s as ``Segment`` tuples.

    ``positions`` and ``loss_mask`` follow from ``segments``: a pipeline's
    batches compute them on first read (a few microseconds), so a consumer that
    never reads them does not pay for them. Given explicitly, they are kept as given.
    """

    __slots__ = ("input_ids", "labels", "lane", "lane_index", "cursor", "segments", "stage", "_positions", "_loss_mask", "_provenance")

    input_ids: np.ndarray
    labels: np.ndarray
    lane: int
    lane_index: int  # this batch's number within its lane, from 0
    cursor: Cursor  # the lane's position after this batch
    segments: np.ndarray  # [n, 5] int64
    stage: int  # the curriculum stage its lane stood in when it was delivered (0 for a single-stage mixture)
    _positions: np.ndarray | None
    _loss_mask: np.ndarray | None
    _provenance: tuple[tuple[Segment, ...], ...] | None

    def __init__(self, input_ids: np.ndarray, labels: np.ndarray, positions: np.ndarray | None = None,
                 loss_mask: np.ndarray | None = None, *, lane: int, lane_index: int, cursor: Cursor, segments: np.ndarray,
                 stage: int = 0) -> None:
        put = object.__setattr__
        put(self, "input_ids", input_ids)
        put(self, "labels", labels)
        put(self, "lane", lane)
        put(self, "lane_index", lane_index)
        put(self, "cursor", cursor)
        put(self, "segments", segments)
        put(self, "stage", stage)
        put(self, "_positions", positions)
        put(self, "_loss_mask", loss_mask)
        put(self, "_provenance", None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Batch is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Batch is immutable: cannot delete {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (self.input_ids, self.labels, self.positions, self.loss_mask, self.lane, self.lane_index, self.cursor, self.segments,
                          self.stage)

    def __repr__(self) -> str:
        return f"Batch(shape={tuple(self.input_ids.shape)}, lane={self.lane}, lane_index={self.lane_index}, cursor={tuple(self.cursor)})"

    def _layout(self) -> None:
        n, L = self.input_ids.shape
        positions, valid = row_layout(self.segments, n, L + 1)
        if self._positions is None:
            object.__setattr__(self, "_positions", positions[:, :-1])
        if self._loss_mask is None:
            object.__setattr__(self, "_loss_mask", valid[:, 1:])

    @property
    def positions(self) -> np.ndarray:
        """``[B, L]`` int64: each input token's place in its document's stretch of the row."""
        if self._positions is None:
            self._layout()
        assert self._positions is not None
        return self._positions

    @property
    def loss_mask(self) -> np.ndarray:
        """``[B, L]`` bool: False where the label is padding."""
        if self._loss_mask is None:
            self._layout()
        assert self._loss_mask is not None
        return self._loss_mask

    @property
    def provenance(self) -> tuple[tuple[Segment, ...], ...]:
        """Per row, where its tokens came from."""
        if self._provenance is None:
            seg = self.segments
            bounds = np.searchsorted(seg[:, 0], np.arange(len(self) + 1)).tolist()
            lines = seg[:, 1:].tolist()
            object.__setattr__(self, "_provenance", tuple(tuple(Segment(*x) for x in lines[a:b]) for a, b in zip(bounds[:-1], bounds[1:])))
        assert self._provenance is not None
        return self._provenance

    @property
    def digest(self) -> str:
        """Content digest: same rows, same digest, whatever lane or rank made it."""
        h = hashlib.blake2b(digest_size=16)
        for a in (self.input_ids, self.labels, self.positions, self.loss_mask):
            h.update(str(a.shape).encode())
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()

    def row_digests(self) -> list[str]:
        """One content digest per row."""
        return [
            hashlib.blake2b(
                np.ascontiguousarray(self.input_ids[r]).tobytes() + np.ascontiguousarray(self.loss_mask[r]).tobytes(), digest_size=16
            ).hexdigest()
            for r in range(len(self.input_ids))
        ]

    def __len__(self) -> int:
        return len(self.input_ids)


def _rebuild(input_ids: np.ndarray, labels: np.ndarray, positions: np.ndarray, loss_mask: np.ndarray, lane: int, lane_index: int,
             cursor: Cursor, segments: np.ndarray, stage: int = 0) -> Batch:
    return Batch(input_ids, labels, positions, loss_mask, lane=lane, lane_index=lane_index, cursor=cursor, segments=segments, stage=stage)
