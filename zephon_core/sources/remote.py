"""Reading byte ranges of one file: ``LocalBytes`` (pread) and, on an object store, ``RemoteBytes``:
few, verified, retried requests.

Reads are served from fixed-size pages (1 MiB) kept in one in-memory LRU per
process with a byte budget (``PagePool``): the pages a batch of documents needs
are fetched with one request per run of consecutive missing pages (coalesced
range requests), so documents that lie
close together, as a block-shuffled source reads them, cost one request for
many. Every request is checked for its byte count and retried with backoff on
transient failures (5xx, SlowDown, connection resets, short bodies); after the
last attempt a ``DataError`` names the object, the byte range and the attempts.
Timing and retries never change the bytes returned.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import fsspec

from zephon_core.errors import DataError

PAGE_BYTES = 1 << 20
MAX_REQUEST_PAGES = 16  # one request covers at most 16 MiB
DEFAULT_ATTEMPTS = 5
_BACKOFF_S = 0.05

# Failures that say something about the request, not the network: never retried.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


class ShortRead(OSError):
    """The store returned fewer bytes than the range asked for."""


def fetch_range(fs: fsspec.AbstractFileSystem, path: str, start: int, end: int, attempts: int = DEFAULT_ATTEMPTS) -> bytes:
    """Bytes ``start..end-1`` of ``path``, verified and retried; ``DataError`` after ``attempts`` failures."""
    last: BaseException | None = None
    for attempt in range(attempts):
        try:
            data = fs.cat_file(path, start=start, end=end)
            if len(data) != end - start:
                raise ShortRead(f"{len(data)} of {end - start} bytes")
            return bytes(data)
        except _PERMANENT:
            raise
        except Exception as e:  # a store client raises many unrelated types for transient trouble
            last = e
            if attempt + 1 < attempts:
                time.sleep(_BACKOFF_S * (2**attempt))
    raise DataError(
        f"{fs.unstrip_protocol(path)}: bytes {start}-{end - 1}: failed after {attempts} attempt(s): {type(last).__name__}: {last}"
    )


class LocalBytes:
    """Byte ranges of a local file, read with ``pread`` on one descriptor shared by all threads."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.size = os.path.getsize(path)
        self._fd: int | None = None
        self._lock = threading.Lock()
        self.requests = 0

    def read_many(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        if self._fd is None:
            with self._lock:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDONLY)
        return [os.pread(self._fd, length, start) for start, length in spans]

    def scan(self, start: int, length: int) -> bytes:
        """One read of a pass over the file (as ``RemoteBytes.scan``)."""
        (block,) = self.read_many([(start, length)])
        return block

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)


class PagePool:
    """The pages of every ``RemoteBytes`` of a process, least recently used first out, within a byte budget.

    One budget for all objects: a source of 10,000 shards must not keep a page
    cache per shard. ``ZEPHON_PAGE_CACHE_MB`` sets it (default 256); it changes
    how often a page is fetched again, never the bytes returned.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._pages: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get_many(self, owner: int, pages: list[int]) -> dict[int, bytes]:
        with self._lock:
            have = {}
            for p in pages:
                data = self._pages.get((owner, p))
                if data is not None:
                    self._pages.move_to_end((owner, p))
                    have[p] = data
            return have

    def put_many(self, owner: int, pages: dict[int, bytes]) -> None:
        with self._lock:
            for p, data in pages.items():
                old = self._pages.pop((owner, p), None)
                self._held += len(data) - (len(old) if old is not None else 0)
                self._pages[(owner, p)] = data
            while self._held > self.budget_bytes and self._pages:
                _, data = self._pages.popitem(last=False)
                self._held -= len(data)


_OWNERS = itertools.count()
PAGES = PagePool(int(float(os.environ.get("ZEPHON_PAGE_CACHE_MB", "256")) * (1 << 20)))


class RemoteBytes:
    """Byte ranges of one object, read through the process's page pool (``PAGES``)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, size: int, *, attempts: int = DEFAULT_ATTEMPTS, pool: PagePool | None = None) -> None:
        self.fs = fs
        self.path = path
        self.size = size
        self.attempts = attempts
        self._pool = pool or PAGES
        self._owner = next(_OWNERS)  # pages are this object's alone: a new object (a new version) never sees old pages
        self.requests = 0  # how many range requests this object cost (for benchmarks)

    def read_many(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``(start, length)`` span, in order."""
        wanted = sorted({p for start, length in spans for p in range(start // PAGE_BYTES, (start + max(length, 1) - 1) // PAGE_BYTES + 1)})
        pages = self._pages_for(wanted)
        out = []
        for start, length in spans:
            first, last = start // PAGE_BYTES, (start + max(length, 1) - 1) // PAGE_BYTES
            blob = b"".join(pages[p] for p in range(first, last + 1))
            offset = start - first * PAGE_BYTES
            out.append(blob[offset : offset + length])
        return out

    def scan(self, start: int, length: int) -> bytes:
        """One verified read that bypasses the pool: a pass over the whole object must not evict the pages in use."""
        self.requests += 1
        return fetch_range(self.fs, self.path, start, start + length, self.attempts)

    def _pages_for(self, wanted: list[int]) -> dict[int, bytes]:
        have = self._pool.get_many(self._owner, wanted)
        missing = [p for p in wanted if p not in have]
        fetched: dict[int, bytes] = {}
        for run in _runs(missing, MAX_REQUEST_PAGES):
            start, end = run[0] * PAGE_BYTES, min(self.size, (run[-1] + 1) * PAGE_BYTES)
            data = fetch_range(self.fs, self.path, start, end, self.attempts)
            self.requests += 1
            for k, p in enumerate(run):
                fetched[p] = data[k * PAGE_BYTES : (k + 1) * PAGE_BYTES]
        self._pool.put_many(self._owner, fetched)
        return {**have, **fetched}


def _runs(pages: list[int], longest: int) -> list[list[int]]:
    """Sorted page numbers cut into runs of consecutive pages, each at most ``longest`` long."""
    runs: list[list[int]] = []
    for p in pages:
        if runs and runs[-1][-1] == p - 1 and len(runs[-1]) < longest:
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


def fetch_object(fs: fsspec.AbstractFileSystem, path: str, size: int, out: Any, attempts: int = DEFAULT_ATTEMPTS) -> None:
    """Copy a whole object into the binary file ``out`` in verified, retried parts of 16 MiB."""
    step = PAGE_BYTES * MAX_REQUEST_PAGES
    for start in range(0, size, step):
        out.write(fetch_range(fs, path, start, min(size, start + step), attempts))


def iter_bytes(reader: LocalBytes | RemoteBytes, step: int = 4 << 20) -> Any:
    """The whole content of ``reader`` in verified blocks of ``step`` bytes (a store's stream API can
    hide a failed request as an early end of file; these reads cannot)."""
    for start in range(0, reader.size, step):
        block = reader.scan(start, min(step, reader.size - start))
        if len(block) != min(step, reader.size - start):
            raise DataError(f"{reader.path}: short read at byte {start} ({len(block)} bytes)")
        yield block
