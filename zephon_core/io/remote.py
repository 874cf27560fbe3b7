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
On S3 every response also says which version of the object it came from (its
ETag and size): one other than the version the source's listing or manifest
recorded is a ``DataError`` at once, so a run never mixes two versions of a file.
Timing and retries never change the bytes returned.
"""

from __future__ import annotations

import io
import itertools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import fsspec.asyn

from zephon_core.errors import DataError
from zephon_core.metrics import COUNTERS

PAGE_BYTES = 1 << 20
MAX_REQUEST_PAGES = 16  # one request covers at most 16 MiB
DEFAULT_ATTEMPTS = 5
_BACKOFF_S = 0.05

# Failures that say something about the request, not the network: never retried.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


class ShortRead(OSError):
    """The store returned fewer bytes than the range asked for."""


@dataclass(frozen=True)
class Version:
    """A version of an object: the one a source's listing or manifest recorded, or the one a read served."""

    size: int  # -1: the store did not say
    etag: str


def check_version(url: str, expect: Version | None, served: Version | None) -> None:
    """A ``DataError`` when a store served another version of an object than the one ``expect`` records."""
    if expect is None or served is None or (served.etag == expect.etag and served.size in (-1, expect.size)):
        return
    raise DataError(f"{url}: stale: the object changed since the source's manifest or listing was read (size {expect.size} -> "
                    f"{served.size if served.size >= 0 else '?'}, etag {expect.etag} -> {served.etag}); rebuild the manifest with `zephon index`")


def serves_versions(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether this store's reads say which version they served (S3, through s3fs)."""
    return "s3" in (fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)) and hasattr(fs, "_call_s3")


async def _s3_get(fs: Any, path: str, start: int, end: int | None) -> tuple[bytes, Version | None, int]:
    bucket, key, version_id = fs.split_path(path)
    extra = {"VersionId": version_id} if version_id else {}
    if end is not None:
        extra["Range"] = f"bytes={start}-{end - 1}"
    resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **extra, **fs.req_kw)
    try:
        data = await resp["Body"].read()
    finally:
        resp["Body"].close()
    etag, whole = str(resp.get("ETag") or "").strip('"'), str(resp.get("ContentRange") or "").rpartition("/")[2]
    # A store that leaves out Content-Range (a whole-object reply) still names the version by its ETag.
    served = Version(int(whole) if whole.isdigit() else -1, etag) if etag else None
    return data, served, end - start if end is not None else int(resp.get("ContentLength", len(data)))


def _get(fs: fsspec.AbstractFileSystem, path: str, start: int, end: int | None) -> tuple[bytes, Version | None, int]:
    """The bytes ``start..end-1`` (``end`` None: the whole object), the version served and the length the store promised."""
    if serves_versions(fs):
        return fsspec.asyn.sync(fs.loop, _s3_get, fs, path, start, end)
    data = fs.cat_file(path, start=start, end=end) if end is not None else fs.cat_file(path)
    return data, None, end - start if end is not None else len(data)


def fetch_range(fs: fsspec.AbstractFileSystem, path: str, start: int, end: int, attempts: int = DEFAULT_ATTEMPTS,
                expect: Version | None = None) -> bytes:
    """Bytes ``start..end-1`` of ``path``, verified and retried; ``DataError`` after ``attempts`` failures,
    or at once when the object is gone or is no longer the version ``expect``."""
    if end <= start:
        return b""
    return _retried(fs, path, start, end, attempts, expect)


def fetch_whole(fs: fsspec.AbstractFileSystem, path: str, attempts: int = DEFAULT_ATTEMPTS) -> bytes:
    """A whole object whose size is not known beforehand, in one GET, verified against the length the
    store promised and retried as ``fetch_range``; ``FileNotFoundError`` when there is no such object."""
    return _retried(fs, path, 0, None, attempts, None)


def _retried(fs: fsspec.AbstractFileSystem, path: str, start: int, end: int | None, attempts: int, expect: Version | None) -> bytes:
    last: BaseException | None = None
    url = fs.unstrip_protocol(path)
    for attempt in range(attempts):
        if attempt:
            COUNTERS.add("store_retries")
        COUNTERS.add("store_requests")
        try:
            data, served, promised = _get(fs, path, start, end)
        except FileNotFoundError:
            if expect is None:
                raise
            raise DataError(f"{url}: stale: the source's manifest or listing has this object, the store does not any more; "
                            "rebuild the manifest with `zephon index`") from None
        except _PERMANENT:
            raise
        except Exception as e:  # a store client raises many unrelated types for transient trouble
            last = e
        else:
            check_version(url, expect, served)
            COUNTERS.add("store_bytes", len(data))
            if len(data) == promised:
                return bytes(data)
            last = ShortRead(f"{len(data)} of {promised} bytes")
        if attempt + 1 < attempts:
            time.sleep(_BACKOFF_S * (2**attempt))
    what = f"bytes {start}-{end - 1}" if end is not None else "the whole object"
    raise DataError(f"{url}: {what}: failed after {attempts} attempt(s): {type(last).__name__}: {last}")


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

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, size: int, *, attempts: int = DEFAULT_ATTEMPTS, pool: PagePool | None = None,
                 etag: str | None = None) -> None:
        self.fs = fs
        self.path = path
        self.size = size
        self.attempts = attempts
        self.expect = Version(size, etag) if etag else None  # every read checks it (see fetch_range)
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
        return fetch_range(self.fs, self.path, start, start + length, self.attempts, self.expect)

    def _pages_for(self, wanted: list[int]) -> dict[int, bytes]:
        have = self._pool.get_many(self._owner, wanted)
        missing = [p for p in wanted if p not in have]
        COUNTERS.add("page_hits", len(have))
        COUNTERS.add("page_misses", len(missing))
        fetched: dict[int, bytes] = {}
        for run in _runs(missing, MAX_REQUEST_PAGES):
            start, end = run[0] * PAGE_BYTES, min(self.size, (run[-1] + 1) * PAGE_BYTES)
            data = fetch_range(self.fs, self.path, start, end, self.attempts, self.expect)
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


def fetch_object(reader: LocalBytes | RemoteBytes, out: Any) -> None:
    """Copy a whole object into the binary file ``out`` in verified, retried parts of 16 MiB."""
    for block in iter_bytes(reader, PAGE_BYTES * MAX_REQUEST_PAGES):
        out.write(block)


class ScanStream(io.RawIOBase):
    """A reader's bytes, start to end, as a read-only stream of verified scans (what a decompressor reads)."""

    def __init__(self, reader: LocalBytes | RemoteBytes, step: int = 4 << 20) -> None:
        self._blocks = iter_bytes(reader, step)
        self._left = memoryview(b"")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        """Bytes delivered so far (a reader of a stream of records learns where each one starts)."""
        return self._pos

    def readinto(self, buffer: Any) -> int:
        if not self._left:
            self._left = memoryview(next(self._blocks, b""))
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        self._pos += n
        return n


def iter_bytes(reader: LocalBytes | RemoteBytes, step: int = 4 << 20) -> Any:
    """The whole content of ``reader`` in verified blocks of ``step`` bytes (a store's stream API can
    hide a failed request as an early end of file; these reads cannot)."""
    for start in range(0, reader.size, step):
        block = reader.scan(start, min(step, reader.size - start))
        if len(block) != min(step, reader.size - start):
            raise DataError(f"{reader.path}: short read at byte {start} ({len(block)} bytes)")
        yield block
