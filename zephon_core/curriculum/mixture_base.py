"""What both mixtures share: sources, seed, chunk size, exhaustion, source orders, the definition's common keys.

``StaticMixture`` (``mixture``) and ``StagedMixture`` (``stages``) are the two
``Mixture`` work sources. A mixture holds its sources, each read through one
endless ``SourceOrder`` (a fresh permutation per epoch, a block shuffle, or file
order) keyed by the seed and the source's place in the list; what a subclass
adds is how many documents of each source chunk ``g`` takes (``_documents``).
A static mixture is a staged one of one document-weighted stage: the same
chunks (``tests/unit/core/curriculum/test_mixture_base.py``), though its
definition keeps its own ``kind`` and form (a fingerprint never changes).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon_core.curriculum.order import BlockShuffle, EpochPermutation, SourceOrder
from zephon_core.curriculum.work_source import Chunk, WorkSource, interleave
from zephon_core.errors import ConfigError
from zephon_core.sources.base import Source
from zephon_core.validation import require_choice, require_int

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


class Mixture(WorkSource):
    """Sources cut into chunks of about ``chunk_size`` documents; the common arguments of both mixtures.

    Args:
        sources: the sources to mix (at least one).
        seed: selects the per-epoch permutations and the interleave of each chunk.
        chunk_size: documents per chunk.
        exhausted: ``"repeat"`` starts a new epoch of a source with a fresh
            permutation; ``"stop"`` ends the curriculum when a source runs out.
        shuffle: permute documents within each epoch (``False`` reads in file order);
            recorded in the definition as given.
        block_size, block_window: with ``shuffle``, shuffle blocks of ``block_size``
            consecutive documents and documents within windows of ``block_window``
            blocks (``curriculum.order.BlockShuffle``). None: per document.
    """

    kind: str  # the definition's "kind"

    def __init__(self, sources: Sequence[Source], *, seed: int, chunk_size: int, exhausted: str, shuffle: Any,
                 block_size: int | None, block_window: int) -> None:
        self.sources = list(sources)
        if not self.sources:
            raise ConfigError(f"{type(self).__name__} needs at least one source")
        self.chunk_size = require_int(chunk_size, "chunk_size", 1)
        self.exhausted = require_choice(exhausted, "exhausted", EXHAUSTION_POLICIES)
        self.seed = require_int(seed, "seed")
        self.block_size = None if block_size is None else require_int(block_size, "block_size", 1)
        self.block_window = require_int(block_window, "block_window", 1)
        self.shuffle = shuffle
        self._orders = [self._order(len(s), i) for i, s in enumerate(self.sources)]

    def _order(self, n: int, source: int) -> SourceOrder:
        """Source ``source``'s order: position of its endless stream -> document."""
        if not self.shuffle:
            return SourceOrder(n)
        if self.block_size is not None:
            return BlockShuffle(n, self.seed, source, self.block_size, self.block_window)
        return EpochPermutation(n, self.seed, source)

    @abstractmethod
    def _documents(self, live: Sequence[int]) -> list[list[np.ndarray]]:
        """Per source, the documents it gives each chunk of ``live`` (all before the curriculum's end)."""

    def chunks(self, gs: Sequence[int]) -> list[Chunk | None]:
        """``[self.chunk(g) for g in gs]``, computed together (same values, far fewer NumPy calls)."""
        for g in gs:
            if g < 0:
                raise IndexError(g)
        end = self.num_chunks
        live = [g for g in gs if end is None or g < end]
        if not live:
            return [None] * len(gs)
        by_g = interleave(live, self._documents(live), self.seed, self.shuffle)
        return [by_g.get(g) for g in gs]

    def _definition(self, sources: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        """The definition's keys both mixtures have, with ``sources`` and the ``more`` of the kind."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "seed": self.seed,
            "chunk_size": self.chunk_size,
            "exhausted": self.exhausted,
            "shuffle": self.shuffle,
            "sources": sources,
            **more,
        }
        order = self._orders[0].definition()
        if order is not None:  # only block mode adds a key: every other definition stays as it was
            out["order"] = order
        return out

    def _settings(self, with_shuffle: bool) -> str:
        """The constructor's settings as ``describe()``'s header shows them (block sizes in block mode)."""
        order = self._orders[0].definition()
        shuffle = f", shuffle={self.shuffle}" if with_shuffle else ""
        blocks = f", block_size={order['block_size']}, block_window={order['window']}" if order else ""
        return f"seed={self.seed}, chunk_size={self.chunk_size}, exhausted={self.exhausted!r}{shuffle}{blocks}"
