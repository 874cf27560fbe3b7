"""The curriculum: one global sequence of work chunks over weighted sources.

Chunk ``g`` is a pure function of the recipe, the seed and ``g``. Every source
contributes a fixed number of documents to every chunk (its weight's
largest-remainder share of ``chunk_size``), so source ``s`` has used exactly
``g * count[s]`` documents before chunk ``g`` and no chunk depends on the ones
before it. Position ``p`` of a source's infinite stream is document
``perm_{s, p // n}(p % n)``: a fresh O(1)-memory permutation per epoch
(``curriculum.order``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon_core.curriculum.order import BlockShuffle, EpochPermutation, SourceOrder
from zephon_core.curriculum.work_source import Chunk, WorkSource, interleave
from zephon_core.errors import ConfigError
from zephon_core.sources.base import Source
from zephon_core.validation import is_int, require_choice, require_int, require_positive_number

EXHAUSTION_POLICIES = ("repeat", "stop")


def largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """Integer shares of ``total`` proportional to ``weights`` (Hamilton's method)."""
    s = math.fsum(weights)
    quotas = [w / s * total for w in weights]
    counts = [math.floor(q) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


class StaticMixture(WorkSource):
    """A fixed-weight mixture of sources, cut into chunks of ``chunk_size`` documents.

    Args:
        sources: the sources to mix.
        weights: one positive, finite weight per source (default: equal).
        seed: selects the per-epoch permutations and the interleave of each chunk.
        chunk_size: documents per chunk; a source's share of a chunk is its
            weight's share of ``chunk_size``, so weights are resolved to
            ``1/chunk_size``.
        exhausted: ``"repeat"`` starts a new epoch of a source with a fresh
            permutation; ``"stop"`` ends the curriculum when the first source
            runs out (its last chunk is partial: no document of that source is
            dropped).
        shuffle: permute documents within each epoch (``False`` reads in file order).
        block_size: with ``shuffle``, shuffle blocks of this many consecutive
            documents and documents within windows of ``block_window`` blocks
            (``curriculum.order.BlockShuffle``) instead of every document: far
            fewer object-store requests, a more local shuffle. None: per document.
        block_window: blocks per window in block mode.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        weights: Sequence[float] | None = None,
        *,
        seed: int = 0,
        chunk_size: int = 64,
        exhausted: str = "repeat",
        shuffle: bool = True,
        block_size: int | None = None,
        block_window: int = 8,
    ) -> None:
        sources = list(sources)
        if not sources:
            raise ConfigError("StaticMixture needs at least one source")
        if weights is None:
            weights = [1.0] * len(sources)
        weights = list(weights)
        if len(weights) != len(sources):
            raise ConfigError(f"StaticMixture: {len(weights)} weights for {len(sources)} sources")
        for i, w in enumerate(weights):
            require_positive_number(w, f"weights[{i}] (source {sources[i].name!r})")
        # Plain Python numbers: NumPy scalars are accepted but must not leak into the JSON state.
        weights = [int(w) if is_int(w) else float(w) for w in weights]
        chunk_size = require_int(chunk_size, "chunk_size", 1)
        require_choice(exhausted, "exhausted", EXHAUSTION_POLICIES)
        seed = require_int(seed, "seed")
        if block_size is not None:
            block_size = require_int(block_size, "block_size", 1)
        block_window = require_int(block_window, "block_window", 1)
        counts = largest_remainder(weights, chunk_size)
        for i, c in enumerate(counts):
            if c == 0:
                raise ConfigError(
                    f"weights[{i}] (source {sources[i].name!r}) is too small to get one document of a chunk of "
                    f"{chunk_size}; raise chunk_size to at least {math.ceil(math.fsum(weights) / weights[i])}"
                )
        self.sources = sources
        self.weights = weights
        self.seed = seed
        self.chunk_size = chunk_size
        self.exhausted = exhausted
        self.shuffle = shuffle
        self.counts = counts
        self._sizes = [len(s) for s in sources]
        self.block_size, self.block_window = block_size, block_window
        self._orders = [self._order(n, i) for i, n in enumerate(self._sizes)]
        self._num_chunks = None if exhausted == "repeat" else min(math.ceil(n / c) for n, c in zip(self._sizes, counts))

    def _order(self, n: int, source: int) -> SourceOrder:
        if not self.shuffle:
            return SourceOrder(n)
        if self.block_size is not None:
            return BlockShuffle(n, self.seed, source, self.block_size, self.block_window)
        return EpochPermutation(n, self.seed, source)

    @property
    def chunks_per_epoch(self) -> int:
        """Chunks after which every source has been through all its documents at least once."""
        return max(math.ceil(n / c) for n, c in zip(self._sizes, self.counts))

    @property
    def num_chunks(self) -> int | None:
        """Chunks in the curriculum, or None when it repeats forever."""
        return self._num_chunks

    def _positions_many(self, s: int, gs: Sequence[int]) -> list[np.ndarray]:
        """Documents of source ``s`` in chunks ``gs``: one pass of its order for all of them.

        A permutation pass costs ~80 NumPy calls whatever the number of indices
        (plus cycle walking), so mapping the positions of many chunks at once is
        much cheaper than one chunk at a time; the values are the same.
        """
        n, c = self._sizes[s], self.counts[s]
        p = (np.asarray(gs, dtype=np.int64)[:, None] * c + np.arange(c, dtype=np.int64)).ravel()
        rows = self._orders[s].documents(p).reshape(len(gs), c)
        if self._num_chunks is None:
            return list(rows)
        pos = p.reshape(len(gs), c)
        return [r[q < n] for r, q in zip(rows, pos)]

    def chunks(self, gs: Sequence[int]) -> list[Chunk | None]:
        """``[self.chunk(g) for g in gs]``, computed together (same values, far fewer NumPy calls)."""
        for g in gs:
            if g < 0:
                raise IndexError(g)
        live = [g for g in gs if self._num_chunks is None or g < self._num_chunks]
        per_source = [self._positions_many(s, live) for s in range(len(self.sources))] if live else []
        by_g = interleave(live, per_source, self.seed, self.shuffle)
        return [by_g.get(g) for g in gs]

    def definition(self) -> dict[str, Any]:
        """Everything that defines the curriculum, for fingerprints and diffs."""
        out: dict[str, Any] = {
            "kind": "static_mixture",
            "seed": self.seed,
            "chunk_size": self.chunk_size,
            "exhausted": self.exhausted,
            "shuffle": self.shuffle,
            "sources": [{"name": s.name, "weight": w, **s.fingerprint()} for s, w in zip(self.sources, self.weights)],
        }
        order = self._orders[0].definition()
        if order is not None:  # only block mode adds a key: every other definition stays as it was
            out["order"] = order
        return out

    def stage_shares(self) -> list[tuple[str, list[float]]]:
        total = math.fsum(self.weights)
        return [("documents", [w / total for w in self.weights])]

    def describe(self) -> list[str]:
        order = f", block_size={self.block_size}, block_window={self.block_window}" if self.block_size and self.shuffle else ""
        lines = [f"StaticMixture(seed={self.seed}, chunk_size={self.chunk_size}, exhausted={self.exhausted!r}{order})"]
        for s, w, c in zip(self.sources, self.weights, self.counts):
            lines.append(f"  {s.describe()}  weight={w:g} -> {c}/{self.chunk_size} per chunk")
        return lines
