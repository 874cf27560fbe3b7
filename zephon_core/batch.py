"""The unit a pipeline delivers: one batch of packed rows from one lane."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

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
    """

    chunk: int
    document: int
    token: int
    delivered_in_window: int

    @classmethod
    def start(cls) -> Cursor:
        return cls(0, 0, 0, 0)


@dataclass(frozen=True, eq=False)
class Batch:
    """Rows ``[B, L]`` as NumPy arrays (``torch.from_numpy`` shares them).

    ``labels`` are ``input_ids`` shifted by one; ``loss_mask`` is False where
    the label is padding; ``positions`` restart at 0 at each row and document
    boundary. ``segments`` holds one ``(row, source, document, start, stop)``
    line per stretch of a row, ordered by row; ``provenance[r]`` lists row
    ``r``'s as ``Segment`` tuples (built on first use).
    """

    input_ids: np.ndarray
    labels: np.ndarray
    positions: np.ndarray
    loss_mask: np.ndarray
    lane: int
    lane_index: int  # this batch's number within its lane, from 0
    cursor: Cursor  # the lane's position after this batch
    segments: np.ndarray  # [n, 5] int64

    @cached_property
    def provenance(self) -> tuple[tuple[Segment, ...], ...]:
        """Per row, where its tokens came from."""
        seg = self.segments
        bounds = np.searchsorted(seg[:, 0], np.arange(len(self) + 1)).tolist()
        lines = seg[:, 1:].tolist()
        return tuple(tuple(Segment(*x) for x in lines[a:b]) for a, b in zip(bounds[:-1], bounds[1:]))

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
