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

from zephon_core.arrays import gather_index
from zephon_core.curriculum.permutation import derive_keys, feistel_domain, permute_ragged
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

    # -- the plan as figures (stats, report, plots); one stage unless a curriculum has more --
    def stage_names(self) -> list[str]:
        """The name of each stage, in order."""
        return ["mixture"]

    def stage_starts(self) -> list[int]:
        """The first global chunk of each stage."""
        return [0]

    def stage_of(self, g: int) -> int:
        """The stage global chunk ``g`` belongs to."""
        starts = self.stage_starts()
        return int(np.searchsorted(np.asarray(starts), g, side="right")) - 1 if len(starts) > 1 else 0

    def stage_shares(self) -> list[tuple[str, list[float]]]:
        """Per stage: what its weights share (``"documents"`` or ``"tokens"``) and each source's share (sums to 1)."""
        return [("documents", [1.0 / len(self.sources)] * len(self.sources))]


def interleave(gs: Sequence[int], per_source: Sequence[Sequence[np.ndarray]], seed: int, shuffle: bool) -> dict[int, Chunk]:
    """Chunk ``gs[j]`` from ``per_source[s][j]`` (the documents source ``s`` gives it), interleaved by a
    per-chunk permutation keyed by ``seed`` and ``g`` (none when ``shuffle`` is off).

    All chunks are laid end to end in one array, and chunks of similar size share
    one batched permutation pass; each chunk is then a slice of the result.
    """
    if not gs:
        return {}
    J, S = len(gs), len(per_source)
    parts = [per_source[s][j] for j in range(J) for s in range(S)]
    lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=J * S)
    docs = np.concatenate(parts)
    srcs = np.repeat(np.tile(np.arange(S, dtype=np.int64), J), lengths)
    sizes = lengths.reshape(J, S).sum(axis=1)
    bounds = np.zeros(J + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    if shuffle:
        # Chunks whose sizes share a Feistel domain are permuted in one pass (chunks of
        # token-weighted stages differ in size); the values are those of one pass per chunk.
        by_domain: dict[int, list[int]] = {}
        domain_of: dict[int, int] = {}
        for j, n in enumerate(sizes.tolist()):
            if n >= 2:
                if n not in domain_of:
                    domain_of[n] = feistel_domain(n)
                by_domain.setdefault(domain_of[n], []).append(j)
        if by_domain:
            order = np.arange(len(docs), dtype=np.int64)
            for group in by_domain.values():
                js = np.asarray(group, dtype=np.int64)
                keys = derive_keys(("interleave", seed), [gs[j] for j in group])
                order[gather_index(bounds[js], sizes[js])] = permute_ragged(sizes[js], keys) + np.repeat(bounds[js], sizes[js])
            srcs, docs = srcs[order], docs[order]
    at = bounds.tolist()
    return {g: Chunk(g, srcs[at[j] : at[j + 1]], docs[at[j] : at[j + 1]]) for j, g in enumerate(gs)}
