"""Reading byte ranges of one file: ``LocalBytes`` (pread) and, on an object store, ``RemoteBytes``:
few, verified, retried requests.

Reads are served from fixed-size pages (1 MiB) kept in a small in-memory LRU per
file: the pages a batch of documents needs are fetched with one request per run
of consecutive missing pages (coalesced range requests), so documents that lie
close together, as a block-shuffled source reads them, cost one request for
many. Every request is checked for its byte count and retried with backoff on
transient failures (5xx, SlowDown, connection resets, short bodies); after the
last attempt a ``DataError`` names the object, the byte range and the attempts.
Timing and retries never change the bytes returned.
"""

from __future__ import annotations

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

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)


class RemoteBytes:
    """Byte ranges of one object, read through a page cache of ``cached_pages`` pages."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, size: int, *, attempts: int = DEFAULT_ATTEMPTS, cached_pages: int = 64) -> None:
        self.fs = fs
        self.path = path
        self.size = size
        self.attempts = attempts
        self._cached_pages = cached_pages
        self._pages: OrderedDict[int, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self.requests = 0  # how many range requests this object cost (for benchmarks)

    def read_many(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``(start, length)`` span, in order."""
        if len(spans) == 1 and spans[0][1] >= PAGE_BYTES * MAX_REQUEST_PAGES // 2:  # a big read (a scan): no caching
            start, length = spans[0]
            self.requests += 1
            return [fetch_range(self.fs, self.path, start, start + length, self.attempts)]
        wanted = sorted({p for start, length in spans for p in range(start // PAGE_BYTES, (start + max(length, 1) - 1) // PAGE_BYTES + 1)})
        pages = self._pages_for(wanted)
        out = []
        for start, length in spans:
            first, last = start // PAGE_BYTES, (start + max(length, 1) - 1) // PAGE_BYTES
            blob = b"".join(pages[p] for p in range(first, last + 1))
            offset = start - first * PAGE_BYTES
            out.append(blob[offset : offset + length])
        return out

    def _pages_for(self, wanted: list[int]) -> dict[int, bytes]:
        with self._lock:
            have = {p: self._pages[p] for p in wanted if p in self._pages}
            for p in have:
                self._pages.move_to_end(p)
        missing = [p for p in wanted if p not in have]
        for run in _runs(missing, MAX_REQUEST_PAGES):
            start, end = run[0] * PAGE_BYTES, min(self.size, (run[-1] + 1) * PAGE_BYTES)
            data = fetch_range(self.fs, self.path, start, end, self.attempts)
            self.requests += 1
            for k, p in enumerate(run):
                have[p] = data[k * PAGE_BYTES : (k + 1) * PAGE_BYTES]
        with self._lock:
            for p in missing:
                self._pages[p] = have[p]
            while len(self._pages) > max(self._cached_pages, len(wanted)):
                self._pages.popitem(last=False)
        return have


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
        (block,) = reader.read_many([(start, min(step, reader.size - start))])
        if len(block) != min(step, reader.size - start):
            raise DataError(f"{reader.path}: short read at byte {start} ({len(block)} bytes)")
        yield block
