"""The chunks of one lane: lane chunk ``k`` is global chunk ``lane + k * C`` of the work source."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from zephon_core.curriculum.work_source import Chunk, WorkSource

# Chunk descriptors a lane computes at once (see StaticMixture.chunks): ~130 KB of indices at 64
# documents a chunk. A pass costs ~100 NumPy calls whatever its size, so the more chunks share it
# the less each costs (about a fifth less per chunk at 128 than at 32). The first call computes
# only 2, so that a (re)start does not wait for 128.
DESCRIPTOR_BATCH = 128
FIRST_DESCRIPTOR_BATCH = 2


class LaneQuarantine:
    """Documents a lane leaves out (quarantined by surgery): each ``(first lane chunk, (source, document) pairs)``
    from that chunk of the lane on. A left-out document keeps its slot as an empty document, as a filtered one
    does, so every other document keeps its place in its chunk."""

    __slots__ = ("_parts",)

    def __init__(self, parts: Sequence[tuple[int, Sequence[tuple[int, int]]]]) -> None:
        self._parts = [(first, np.array([s << 40 | d for s, d in pairs], dtype=np.int64)) for first, pairs in parts]

    def mask(self, chunk: np.ndarray, sources: np.ndarray, documents: np.ndarray) -> np.ndarray:
        """Which of these documents (lane chunk, source and document number, parallel arrays) are left out."""
        keys = sources.astype(np.int64) << 40 | documents.astype(np.int64)
        out = np.zeros(len(keys), dtype=bool)
        for first, wanted in self._parts:
            out |= (chunk >= first) & np.isin(keys, wanted)
        return out


class LaneChunks:
    """Chunk descriptors of one lane, computed in batches and kept for a while.

    ``chunks[k]`` is lane chunk ``k`` (None past the end of a finite
    curriculum). Safe to use from the reader threads and the caller at once.
    """

    def __init__(self, work_source: WorkSource, lane: int, canonical_replicas: int,
                 quarantine: LaneQuarantine | None = None) -> None:
        self.work_source = work_source
        self.quarantine = quarantine
        self.lane = lane
        self._stride = canonical_replicas
        self._cache: dict[int, Chunk | None] = {}
        self._lock = threading.Lock()
        self._batch = FIRST_DESCRIPTOR_BATCH

    def __getitem__(self, k: int) -> Chunk | None:
        with self._lock:
            if k not in self._cache:
                for old in [c for c in self._cache if c < k - DESCRIPTOR_BATCH]:
                    del self._cache[old]
                ks = range(k, k + self._batch)
                self._batch = DESCRIPTOR_BATCH
                self._cache.update(zip(ks, self.work_source.chunks([self.lane + j * self._stride for j in ks])))
            return self._cache[k]

    @property
    def per_epoch(self) -> int:
        """Global chunks after which every source has been through all its documents."""
        return self.work_source.chunks_per_epoch
