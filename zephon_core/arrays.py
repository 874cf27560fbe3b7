"""Index arithmetic on NumPy arrays that sources, curricula and lanes share: documents end to end."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending (``np.unique``); one comparison pass in the common case of a single value."""
    if len(values) and (values == values[0]).all():
        return values[:1].copy()
    return np.unique(values)


def read_flat_grouped(groups: np.ndarray, read: Callable[[int, np.ndarray | slice, int], tuple[np.ndarray, np.ndarray]],
                      headroom: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Documents read group by group, put back in their given order: ``read(g, where, room)`` returns
    the flat tokens, after ``room`` unused slots, and the lengths of the documents at positions
    ``where`` (those of group ``g``; a whole slice when there is one group, so the common case
    indexes nothing).

    Returns the flat tokens (int64, after ``headroom`` unused slots) and the lengths of every
    document, in the order of ``groups``.
    """
    kinds = distinct(groups)
    if len(kinds) == 1:
        return read(int(kinds[0]), slice(None), headroom)
    lengths = np.zeros(len(groups), dtype=np.int64)
    parts = []
    for g in kinds:
        where = np.flatnonzero(groups == g)
        part, part_len = read(int(g), where, 0)
        lengths[where] = part_len
        parts.append((where, part, part_len))
    tokens = np.empty(headroom + int(lengths.sum()), dtype=np.int64)
    starts = headroom + np.cumsum(lengths) - lengths
    for where, part, part_len in parts:
        tokens[gather_index(starts[where], part_len)] = part
    return tokens, lengths


def gather_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices of ``starts[j] .. starts[j] + lengths[j] - 1`` for every ``j``, end to end."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    idx = np.arange(total, dtype=np.int64)
    idx += np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths)
    return idx
