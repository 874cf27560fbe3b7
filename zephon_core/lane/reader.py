"""Which pieces a lane reads, and reading them (ahead, in a thread pool, where there is one).

A piece is named by a ``PieceKey``. Its bounds depend only on the lane's
chunks, the operators and where the lane (re)started, never on timing, so the
same documents reach the packer whatever is read ahead.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future
from typing import NamedTuple

from zephon_core.lane.chunks import LaneChunks
from zephon_core.lane.docops import DocOpRunner
from zephon_core.lane.packing import Position
from zephon_core.lane.pieces import Piece, load_piece, slice_bounds

# Without per-document operators, and from pretokenized sources, a piece after the first
# spans whole chunks up to this many documents, so that cutting rows costs a few NumPy
# calls per many batches.
PIECE_DOCS = 512


class PieceKey(NamedTuple):
    """Documents ``lo..hi-1`` of lane chunk ``chunk``, then the whole of the ``extra`` chunks after it."""

    chunk: int
    lo: int
    hi: int
    extra: int


class PieceReader:
    """Plans and reads the pieces of one lane that (re)started at ``start``.

    The first chunk after a (re)start is read alone, and with per-document
    operators in slices (``pieces.SLICE_DOCS``), so the first batch waits only
    for the documents it needs; later pieces are read ``readahead`` ahead on
    ``pool``, unless they come straight from pretokenized sources (``read_flat``).
    Each piece has ``headroom`` free tokens in front (the packer's).
    """

    def __init__(self, chunks: LaneChunks, runner: DocOpRunner, start: Position, pool: Executor | None, readahead: int,
                 headroom: int = 0) -> None:
        self.chunks = chunks
        self._headroom = headroom
        self._runner = runner
        self._first = start  # its chunk is read in slices, from its document on
        self._flat = all(callable(getattr(s, "read_flat", None)) for s in chunks.work_source.sources)
        # Flat reads from memory-mapped token arrays are copies that hold the GIL: on a thread
        # they would only add two hand-overs a piece (about a fifth of a batch's time, measured
        # in docs/performance.md), so they run in the caller's thread.
        self._pool = None if self._flat and not runner.ops else pool
        self._readahead = max(0, readahead)
        self._futures: dict[PieceKey, Future[Piece]] = {}

    def key(self, k: int, i: int) -> PieceKey | None:
        """The piece holding document ``i`` of lane chunk ``k`` (None past the end of the data or of the chunk)."""
        desc = self.chunks[k]
        if desc is None or i >= len(desc):
            return None
        if not self._runner.ops:
            # The first chunk alone (a restore reads no more than it needs), then several
            # chunks at once where sources hand over flat token arrays.
            extra, docs = 0, len(desc) - i
            while docs < PIECE_DOCS and k != self._first.chunk and self._flat:
                nxt = self.chunks[k + extra + 1]
                if nxt is None or docs + len(nxt) > PIECE_DOCS:
                    break
                extra, docs = extra + 1, docs + len(nxt)
            return PieceKey(k, i, len(desc), extra)
        if k == self._first.chunk and i >= self._first.document:
            lo, hi = slice_bounds(len(desc), self._first.document, i)
        else:
            lo, hi = 0, len(desc)
        return PieceKey(k, lo, hi, 0)

    def end_of(self, key: PieceKey) -> Position:
        """The packer position right after a piece."""
        if not key.extra:
            return Position(key.chunk, key.hi, 0)
        last = self.chunks[key.chunk + key.extra]
        assert last is not None
        return Position(key.chunk + key.extra, len(last), 0)

    def read(self, key: PieceKey) -> Piece:
        """The piece, and read-ahead of the ones after it."""
        for stale in [f for f in self._futures if f[:2] < key[:2]]:
            self._futures.pop(stale).cancel()
        # The first chunk's slices are read here, without read-ahead: after a restore the
        # first batch would otherwise share the CPU with documents it does not need.
        if self._pool is None or self._is_slice(key):
            return self._load(key)
        ahead: PieceKey | None = key
        for _ in range(1 + self._readahead):
            if ahead is None:
                break
            if ahead not in self._futures:
                self._futures[ahead] = self._pool.submit(self._load, ahead)
            ahead = self._following(ahead)
        return self._futures.pop(key).result()

    def _is_slice(self, key: PieceKey) -> bool:
        return bool(self._runner.ops) and key.chunk == self._first.chunk

    def _following(self, key: PieceKey) -> PieceKey | None:
        k, i, _ = self.end_of(key)
        nxt = self.key(k, i)
        if nxt is None and self.chunks[k + 1] is not None:
            nxt = self.key(k + 1, 0)
        return nxt

    def _load(self, key: PieceKey) -> Piece:
        parts = []
        for e in range(key.extra + 1):
            desc = self.chunks[key.chunk + e]
            assert desc is not None
            parts.append((key.chunk + e, desc, key.lo if e == 0 else 0, key.hi if e == 0 else len(desc)))
        return load_piece(self.chunks.work_source, self._runner, parts, self._headroom, self.chunks.quarantine)
