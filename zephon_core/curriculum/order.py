"""The order in which one source's documents are used: position ``p`` of its endless stream -> document.

Position ``p`` is in epoch ``p // n`` of a source of ``n`` documents. Each order
maps any batch of positions independently, in O(1) memory, so a work source can
compute any chunk from its number alone.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from zephon_core.curriculum.permutation import IndexPermutation, derive_key


@functools.lru_cache(maxsize=64)
def _permutation(n: int, key: int) -> IndexPermutation:
    """Permutation objects are immutable; caching them saves 7 blake2b key derivations per chunk."""
    return IndexPermutation(n, key)


class SourceOrder:
    """File order: position ``p`` is document ``p % n``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def documents(self, positions: np.ndarray) -> np.ndarray:
        """The document at each position (int64)."""
        return positions % self.n

    def definition(self) -> dict[str, Any] | None:
        """What this order adds to the work source's definition (None: nothing beyond ``shuffle``)."""
        return None


class EpochPermutation(SourceOrder):
    """A fresh stateless permutation of the ``n`` documents in every epoch, keyed by seed, source and epoch."""

    def __init__(self, n: int, seed: int, source: int) -> None:
        super().__init__(n)
        self.seed = seed
        self.source = source

    def documents(self, positions: np.ndarray) -> np.ndarray:
        out = np.empty_like(positions)
        epochs = positions // self.n
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = _permutation(self.n, derive_key("epoch", self.seed, self.source, int(e))).take(positions[sel] % self.n)
        return out
