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

from zephon_core.curriculum.mixture_base import EXHAUSTION_POLICIES, Mixture, largest_remainder
from zephon_core.errors import ConfigError
from zephon_core.sources.base import Source
from zephon_core.validation import is_int, require_positive_number

__all__ = ["EXHAUSTION_POLICIES", "StaticMixture", "largest_remainder"]


class StaticMixture(Mixture):
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

    kind = "static_mixture"

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
        super().__init__(sources, seed=seed, chunk_size=chunk_size, exhausted=exhausted, shuffle=shuffle,
                         block_size=block_size, block_window=block_window)
        sources = self.sources
        weights = [1.0] * len(sources) if weights is None else list(weights)
        if len(weights) != len(sources):
            raise ConfigError(f"StaticMixture: {len(weights)} weights for {len(sources)} sources")
        for i, w in enumerate(weights):
            require_positive_number(w, f"weights[{i}] (source {sources[i].name!r})")
        # Plain Python numbers: NumPy scalars are accepted but must not leak into the JSON state.
        self.weights = [int(w) if is_int(w) else float(w) for w in weights]
        self.counts = largest_remainder(self.weights, self.chunk_size)
        for i, c in enumerate(self.counts):
            if c == 0:
                raise ConfigError(
                    f"weights[{i}] (source {sources[i].name!r}) is too small to get one document of a chunk of "
                    f"{self.chunk_size}; raise chunk_size to at least "
                    f"{math.ceil(math.fsum(self.weights) / self.weights[i])}"
                )
        self._sizes = [len(s) for s in sources]
        self._num_chunks = None if self.exhausted == "repeat" else min(
            math.ceil(n / c) for n, c in zip(self._sizes, self.counts))

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

    def _documents(self, live: Sequence[int]) -> list[list[np.ndarray]]:
        return [self._positions_many(s, live) for s in range(len(self.sources))]

    def definition(self) -> dict[str, Any]:
        """Everything that defines the curriculum, for fingerprints and diffs."""
        sources = [{"name": s.name, "weight": w, **s.fingerprint()} for s, w in zip(self.sources, self.weights)]
        return self._definition(sources)

    def stage_shares(self) -> list[tuple[str, list[float]]]:
        total = math.fsum(self.weights)
        return [("documents", [w / total for w in self.weights])]

    def describe(self) -> list[str]:
        lines = [f"StaticMixture({self._settings(with_shuffle=False)})"]
        for s, w, c in zip(self.sources, self.weights, self.counts):
            lines.append(f"  {s.describe()}  weight={w:g} -> {c}/{self.chunk_size} per chunk")
        return lines
