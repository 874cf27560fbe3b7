"""Atomic file writes: a reader sees the old file, no file, or the whole new one, never a part.

On a file system a file is written under a temporary name in its own folder and
renamed over the target (a rename within a folder is atomic); on an object store
one PUT is atomic already. Used by the index and shard caches, the index manifest
and the checkpoint aggregation folder.

A reader on any node sees the whole file once it is renamed, but after a power loss a
renamed file may be empty or short unless it was synced: ``durable=True`` syncs the file
before its rename and its folder after (the shard cache, whose entries are read as they
are). The aggregation records and the index cache are validated when read, and such a
file is rejected or rebuilt, so they skip the syncs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import IO, Protocol

import fsspec

from zephon_core.io.fs import is_local

TMP_PREFIX = ".tmp-"  # a file being written; folders whose files are listed skip these
MODE = 0o644  # every published file, whatever the umask


class TempFiles(Protocol):
    """The three operations of an atomic write, one call each (the aggregation folder counts them)."""

    def create(self, folder: str) -> tuple[int, str]:
        """A new temporary file in ``folder``: its open descriptor and its path."""

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` over ``dst`` atomically."""

    def delete(self, path: str) -> None:
        """Remove ``path``; a missing file is not an error."""


class LocalFiles:
    """``TempFiles`` on a local or mounted file system."""

    def create(self, folder: str) -> tuple[int, str]:
        return tempfile.mkstemp(dir=folder, prefix=TMP_PREFIX)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def delete(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


LOCAL_FILES = LocalFiles()


def sync_folder(folder: str | os.PathLike[str]) -> None:
    """Make the renames in ``folder`` durable (a no-op where a folder cannot be opened to sync, as on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object],
                     files: TempFiles = LOCAL_FILES, durable: bool = False) -> None:
    """Make the local file ``path`` (mode 0o644) from what ``write(file)`` writes, all at once.

    ``write`` fills a temporary file in ``path``'s folder, which must exist; it is then
    renamed over ``path``. If anything fails, the temporary file is removed, ``path``
    is left as it was and the exception propagates. ``durable``: the file is synced before
    the rename and the folder after, so that a power loss leaves the old file or the whole new one.
    """
    target = os.fspath(path)
    folder = os.path.dirname(target) or "."
    fd, tmp = files.create(folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            os.fchmod(f.fileno(), MODE)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        files.rename(tmp, target)
    except BaseException:
        files.delete(tmp)
        raise
    if durable:
        sync_folder(folder)


def put_atomically(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """``data`` as the file ``path`` of ``fs``, all at once: renamed into place on a file system
    (its folder made first), one PUT on an object store."""
    if not is_local(fs):
        fs.pipe_file(path, data)
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_atomically(path, lambda f: f.write(data))
