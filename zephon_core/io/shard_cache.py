"""A node-local cache of whole files (fetched objects, decompressed shards), bounded in bytes.

Entries are named by a digest of what they hold (URL, the source file's
fingerprint, the transformation), written to a temporary file and renamed into
place, so the pipelines of one node can share the folder: a reader sees a whole
entry or none. Least recently used entries are removed once the folder holds more
than ``max_bytes``; a reader that loses an entry to eviction between finding and
opening it simply makes it again.

An entry survives a power loss whole or not at all: it is synced before its rename and
its folder after, and only then is its size recorded beside it (``<digest>.ok``, synced
the same way). A hit needs the record and an entry of the recorded size; an entry without
one (torn, or left by a crash before its record) is made again, never read.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from zephon_core.io import index_cache
from zephon_core.io.atomic import write_atomically
from zephon_core.metrics import COUNTERS

DEFAULT_MAX_BYTES = 64 << 30
ENV_MAX_BYTES = "ZEPHON_SHARD_CACHE_BYTES"


def default_max_bytes() -> int:
    try:
        return int(os.environ.get(ENV_MAX_BYTES, DEFAULT_MAX_BYTES))
    except ValueError:
        return DEFAULT_MAX_BYTES


def _touch(path: os.PathLike[str] | str | int) -> None:
    # An explicit time: a file system's own timestamps can be too coarse to order quick uses.
    now = time.time_ns()
    os.utime(path, ns=(now, now))


def _write_entry(f: IO[bytes], make: Callable[[IO[bytes]], None]) -> None:
    make(f)
    f.flush()
    _touch(f.fileno())  # the entry's use time, set before it is renamed into place


def _record(entry: Path) -> Path:
    """Where an entry's size is recorded, once the entry is durable."""
    return entry.with_suffix(".ok")


def _intact(entry: Path) -> bool:
    """Whether ``entry`` is whole: its size recorded, and the size it has."""
    try:
        return int(_record(entry).read_bytes()) == entry.stat().st_size
    except (OSError, ValueError):
        return False


class ShardCache:
    """Whole files under ``root`` (default: the index cache folder's ``shards/``), at most ``max_bytes``."""

    def __init__(self, root: str | os.PathLike[str] | None = None, max_bytes: int | None = None) -> None:
        self.root = Path(root) if root is not None else index_cache.cache_root(None) / "shards"
        self.max_bytes = default_max_bytes() if max_bytes is None else max_bytes

    def path_for(self, key: str) -> Path:
        return self.root / (hashlib.blake2b(key.encode(), digest_size=16).hexdigest() + ".bin")

    def get(self, key: str, make: Callable[[IO[bytes]], None]) -> Path:
        """The entry for ``key``, made by ``make(file)`` when missing or torn. Returns a path that exists now."""
        path = self.path_for(key)
        for _ in range(3):
            if _intact(path):
                try:
                    _touch(path)  # a hit: most recently used
                    COUNTERS.add("shard_cache_hits")
                    return path
                except FileNotFoundError:
                    pass
            COUNTERS.add("shard_cache_misses")
            self.root.mkdir(parents=True, exist_ok=True)
            write_atomically(path, lambda f: _write_entry(f, make), durable=True)
            record = str(path.stat().st_size).encode()
            write_atomically(_record(path), lambda f, record=record: f.write(record),  # type: ignore[misc]
                             durable=True)
            self._evict(keep=path)
            if path.exists():
                return path
        return path

    def _evict(self, keep: Path) -> None:
        entries = []
        for p in self.root.glob("*.bin"):
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            entries.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in entries)
        for _, size, p in sorted(entries):
            if total <= self.max_bytes:
                break
            if p == keep:
                continue
            try:
                _record(p).unlink(missing_ok=True)  # first: a record never outlives its entry's removal
                p.unlink()  # an open reader keeps its data (POSIX)
                total -= size
            except FileNotFoundError:
                pass
