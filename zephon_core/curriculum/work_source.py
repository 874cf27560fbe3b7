"""What a pipeline reads: a work source, one global sequence of chunks of documents.

Chunk ``g`` must be a pure function of the work source's definition and ``g``:
that is what lets every rank compute its own chunks without communication and
lets a lane seek to any chunk. ``StaticMixture`` is one work source; others
(staged curricula, for instance) implement the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_core.curriculum.permutation import derive_key, feistel_domain, permute_ragged
from zephon_core.sources.base import Source


@dataclass(frozen=True)
class Chunk:
    """Documents of one chunk as parallel arrays, in delivery order."""

    index: int
    sources: np.ndarray  # source number per document
    documents: np.ndarray  # document number within that source

    def __len__(self) -> int:
        return len(self.sources)


class WorkSource(ABC):
    """A global sequence of chunks over ``sources``, each chunk a pure function of its number."""

    sources: list[Source]

    @abstractmethod
    def chunks(self, gs: Sequence[int]) -> list[Chunk | None]:
        """Chunks ``gs`` (None past the end of a finite curriculum), computed together."""

    def chunk(self, g: int) -> Chunk | None:
        """Chunk ``g``, or None past the end of a finite curriculum."""
        return self.chunks([g])[0]

    @property
    @abstractmethod
    def chunks_per_epoch(self) -> int:
        """Chunks after which every source has been through all its documents at least once."""

    @property
    @abstractmethod
    def num_chunks(self) -> int | None:
        """Chunks in the curriculum, or None when it repeats forever."""

    @abstractmethod
    def definition(self) -> dict[str, Any]:
        """Everything that defines the chunks, for fingerprints and diffs (JSON data)."""

    @abstractmethod
    def describe(self) -> list[str]:
        """Lines for ``explain()``."""


def interleave(gs: Sequence[int], per_source: Sequence[Sequence[np.ndarray]], seed: int, shuffle: bool) -> dict[int, Chunk]:
    """Chunk ``gs[j]`` from ``per_source[s][j]`` (the documents source ``s`` gives it), interleaved by a
    per-chunk permutation keyed by ``seed`` and ``g`` (none when ``shuffle`` is off).

    Chunks of similar size share one batched permutation pass.
    """
    unmixed: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for j, g in enumerate(gs):
        docs = [per_source[s][j] for s in range(len(per_source))]
        srcs = [np.full(len(d), s, dtype=np.int64) for s, d in enumerate(docs)]
        unmixed[g] = (np.concatenate(srcs), np.concatenate(docs))
    # Chunks whose sizes share a Feistel domain are permuted in one pass (chunks of
    # token-weighted stages differ in size); the values are those of one pass per chunk.
    by_domain: dict[int, list[int]] = {}
    out: dict[int, Chunk] = {}
    for g, (src, doc) in unmixed.items():
        if not shuffle or len(src) < 2:
            out[g] = Chunk(g, src, doc)
        else:
            by_domain.setdefault(feistel_domain(len(src)), []).append(g)
    for group in by_domain.values():
        keys = [derive_key("interleave", seed, g) for g in group]
        for g, order in zip(group, permute_ragged([len(unmixed[g][0]) for g in group], keys)):
            src, doc = unmixed[g]
            out[g] = Chunk(g, src[order], doc[order])
    return out
