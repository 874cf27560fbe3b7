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

# Sources of up to this many documents keep their epoch's whole order (8 bytes a document):
# mapped once per epoch, a chunk's documents are then a gather instead of ~3 Feistel
# passes (cycle walking) per position. The values are the permutation's either way.
EPOCH_TABLE_MAX = 1 << 20
_TABLES_KEPT = 4


@functools.lru_cache(maxsize=64)
def _permutation(n: int, key: int) -> IndexPermutation:
    """Permutation objects are immutable; caching them saves 7 blake2b key derivations per chunk."""
    return IndexPermutation(n, key)


@functools.lru_cache(maxsize=_TABLES_KEPT)
def _epoch_table(n: int, key: int) -> np.ndarray:
    """``_permutation(n, key)`` at every index, read-only."""
    table = _permutation(n, key).take(np.arange(n, dtype=np.int64))
    table.flags.writeable = False
    return table


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
            key = derive_key("epoch", self.seed, self.source, int(e))
            within = positions[sel] % self.n
            out[sel] = _epoch_table(self.n, key)[within] if self.n <= EPOCH_TABLE_MAX else _permutation(self.n, key).take(within)
        return out


class BlockShuffle(SourceOrder):
    """Locality-preserving shuffle: blocks of ``block`` consecutive documents, permuted per epoch,
    then documents permuted within each window of ``window`` consecutive (permuted) blocks.

    One epoch is ``n // block`` full blocks in a seeded order, then the last
    partial block, cut into windows of ``window`` blocks (``window * block``
    documents, the last window shorter). Position ``p`` of an epoch lies in
    window ``p // (window * block)``, so every position maps in O(1) memory and
    without looking at any other. Documents of one window come from at most
    ``window`` runs of consecutive documents, which is what lets one object-store
    request serve many of them; the price is that a document's neighbours in the
    stream come from the same ``window * block`` documents.
    """

    def __init__(self, n: int, seed: int, source: int, block: int, window: int) -> None:
        super().__init__(n)
        self.seed, self.source, self.block, self.window = seed, source, block, window
        self._full = n // block  # full blocks; the rest (n % block documents) is the last, partial block

    def definition(self) -> dict[str, Any] | None:
        return {"kind": "blocks", "block_size": self.block, "window": self.window}

    def _window_docs(self, e: int, w: int, windows: int) -> np.ndarray:
        """Document numbers of window ``w`` of epoch ``e``, in natural order (before the window's permutation)."""
        first, last = w * self.window, min((w + 1) * self.window, self._full)
        blocks = _permutation(self._full, derive_key("blocks", self.seed, self.source, e)).take(np.arange(first, last)) \
            if self._full > 1 and last > first else np.arange(first, last, dtype=np.int64)
        docs = (blocks[:, None] * self.block + np.arange(self.block, dtype=np.int64)).ravel()
        if w == windows - 1 and self.n % self.block:  # the last window also holds the partial block
            docs = np.concatenate([docs, np.arange(self._full * self.block, self.n, dtype=np.int64)])
        return docs

    def documents(self, positions: np.ndarray) -> np.ndarray:
        span = self.window * self.block
        windows = max(1, -(-self.n // span))
        out = np.empty_like(positions)
        epochs, within = positions // self.n, positions % self.n
        wins = np.minimum(within // span, windows - 1)
        keys = epochs * windows + wins
        for key in np.unique(keys):
            e, w = divmod(int(key), windows)
            sel = keys == key
            docs = self._window_docs(e, w, windows)
            offset = within[sel] - w * span
            if len(docs) > 1:
                offset = _permutation(len(docs), derive_key("window", self.seed, self.source, e, w)).take(offset)
            out[sel] = docs[offset]
        return out
