"""Count the file-system operations and bytes of one rank's aggregation folder.

    from zephon_dev.fsops import count
    ops = count(aggregator.dir)     # wraps the folder's io in place
    ... aggregator.checkpoint(state) ...
    ops.metadata, ops.bytes_written, ops.bytes_read, ops.by_kind

``AggregateFolder.io`` makes one call per file-system operation: on a folder an
``open`` to read, a ``create`` + ``rename`` to publish a file atomically, a
``write`` (an open for writing) to write a part in place, a ``list``, a ``delete``; on an object store one request each (a bulk read or
delete counts one per file, as the store does the work per file). Every kind
counts as a metadata operation: each is a lookup or a change of the namespace
(on a parallel file system, a request to its metadata server). Bytes are the
payloads read and written. Used by tests and by bench/goals/p4s_scale/aggregate_scale.py.
"""

from __future__ import annotations

import collections
from typing import Any


class OpCount:
    """Per-kind operation counts and payload bytes; ``reset()`` starts a new count."""

    def __init__(self) -> None:
        self.by_kind: collections.Counter[str] = collections.Counter()
        self.by_file: collections.Counter[str] = collections.Counter()  # the same operations by file: round, part, merged, ...
        self.bytes_read = 0
        self.bytes_written = 0

    def add(self, kind: str, path: str, n: int = 1) -> None:
        self.by_kind[kind] += n
        name = path.rstrip("/").rsplit("/", 1)[-1]
        self.by_file["tmp" if name.startswith(".tmp-") else name.split("-")[0].split(".")[0]] += n

    @property
    def metadata(self) -> int:
        return sum(self.by_kind.values())

    def reset(self) -> None:
        self.by_kind.clear()
        self.by_file.clear()
        self.bytes_read = self.bytes_written = 0

    def as_dict(self) -> dict[str, Any]:
        return {"metadata": self.metadata, "by_kind": dict(self.by_kind), "by_file": dict(self.by_file), "bytes_read": self.bytes_read, "bytes_written": self.bytes_written}


class _CountingIO:
    """Delegates to the folder's io, counting each call by kind."""

    def __init__(self, inner: Any, n: OpCount) -> None:
        self._inner, self._n = inner, n

    # local folder
    def create(self, folder: str) -> tuple[int, str]:
        self._n.add("create", ".tmp-")
        return self._inner.create(folder)

    def write(self, path: str, data: bytes) -> None:
        self._n.add("write", path)
        self._n.bytes_written += len(data)
        self._inner.write(path, data)

    def rename(self, src: str, dst: str) -> None:
        self._n.add("rename", dst)
        self._inner.rename(src, dst)

    def listdir(self, path: str) -> list[str]:
        self._n.add("list", "dir")
        return self._inner.listdir(path)

    def delete(self, path: str) -> None:
        self._n.add("delete", path)
        self._inner.delete(path)

    def read(self, path: str) -> bytes | None:
        self._n.add("open", path)
        data = self._inner.read(path)
        self._n.bytes_read += len(data or b"")
        return data

    # object store
    def put(self, path: str, data: bytes) -> None:
        self._n.add("put", path)
        self._n.bytes_written += len(data)
        self._inner.put(path, data)

    def read_many(self, paths: list[str]) -> dict[str, bytes]:
        for p in paths:
            self._n.add("open", p)
        out = self._inner.read_many(paths)
        self._n.bytes_read += sum(len(v) for v in out.values())
        return out

    def delete_many(self, paths: list[str]) -> None:
        for p in paths:
            self._n.add("delete", p)
        self._inner.delete_many(paths)


def count(folder: Any) -> OpCount:
    """Wrap ``folder.io`` (an AggregateFolder's) so that its operations are counted; returns the count."""
    n = OpCount()
    folder.io = _CountingIO(folder.io, n)
    if folder.local:  # bytes written on a folder go through the file descriptor, not the io
        real_put = folder.put

        def put(name: str, data: bytes) -> None:
            n.bytes_written += len(data)
            real_put(name, data)

        folder.put = put
    return n
