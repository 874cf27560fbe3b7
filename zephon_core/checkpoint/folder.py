"""The run's aggregation folder: ``<aggregate_dir>/<run_id>/`` on a filesystem or an object store.

Files are published atomically (rename on a filesystem, one PUT on an object
store), so a reader never sees half of one, except parts: those are written
in place (``write``, one operation instead of two) and their readers take
only a record that matches its SHA-256. Listings are never cached.

Every file-system operation goes through ``AggregateFolder.io``, one call per
operation (an ``open``, a ``rename``, a listing, one request to a store), so
that a wrapper can count them (``zephon_dev/fsops.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import fsspec

from zephon_core.errors import AggregationError
from zephon_core.io.atomic import LocalFiles, write_atomically
from zephon_core.io.fs import is_local


@dataclass(frozen=True)
class Pacing:
    """How often ranks look for files (seconds); timing only, no step of the protocol depends on it.

    A folder is cheap to look at, an object store bills every look, so the store
    waits longer. ``merge_max_s``: the longest pause of a writer waiting for the
    parts it merges (few writers do, looking at one missing part at a time);
    ``follow_max_s``: of a rank waiting for the merged state. Between two looks
    of one rank there are at least ``world_size / follow_budget`` seconds, so that
    all ranks together look at most ``follow_budget`` times a second: about what
    a parallel file system's metadata server, or an object store's prefix (S3:
    5,500 reads a second), serves without slowing down.
    """

    first_s: float
    merge_max_s: float
    follow_max_s: float
    follow_budget: float
    moved_check_s: float  # a merging writer looks for a replaced round this often
    again_s: float  # a rank that missed the merged state (or the round being opened) looks again no sooner than this
    per_writer_s: float  # with nothing to go by, a rank first looks for the merged state this long per writer after its call
    guess_floor_s: float  # ... and no sooner than this: a launch's first round is one round, an extra look every rank's

    @staticmethod
    def of(local: bool) -> Pacing:
        return Pacing(0.005, 0.05, 2.0, 20000.0, 1.0, 0.02, 0.00025, 0.1) if local else Pacing(0.02, 0.1, 5.0, 3000.0, 2.0, 0.1, 0.0003, 0.5)


class LocalIO(LocalFiles):
    """A local or mounted shared filesystem; each method is one operation."""

    def write(self, path: str, data: bytes) -> None:
        # os.open + fdopen (not open()): one open of the file, for writing; 0o644 as every published file
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "wb") as f:
            f.write(data)

    def read(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []


class StoreIO:
    """An object store (or any fsspec filesystem) through fsspec; each method is one request (``read_many``/``delete_many``: one per file)."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def put(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data)

    def read(self, path: str) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(path))
        except FileNotFoundError:
            return None

    def read_many(self, paths: list[str]) -> dict[str, bytes]:
        """Concurrently; missing files are left out."""
        return {p.rstrip("/"): bytes(v) for p, v in self.fs.cat(paths, on_error="omit").items()}

    def listdir(self, path: str) -> list[str]:
        self.fs.invalidate_cache(path)
        try:
            return [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(path, detail=False)]
        except FileNotFoundError:
            return []

    def delete_many(self, paths: list[str]) -> None:
        try:  # one bulk request (S3 DeleteObjects) instead of one per file
            self.fs.rm(paths)
        except (FileNotFoundError, OSError):
            for p in paths:
                try:
                    self.fs.rm_file(p)
                except (FileNotFoundError, OSError):
                    pass


class AggregateFolder:
    """The run's folder: atomic publication, reads of whole files, uncached listing."""

    def __init__(self, aggregate_dir: str, run_id: str, storage_options: dict[str, Any]) -> None:
        fs, _, paths = fsspec.get_fs_token_paths(aggregate_dir, storage_options=storage_options)
        self.local = is_local(fs)
        self.path = paths[0].rstrip("/") + "/" + run_id
        self.io: Any = LocalIO() if self.local else StoreIO(fs)
        self.pacing = Pacing.of(self.local)
        try:
            if self.local:
                os.makedirs(self.path, exist_ok=True)
            else:
                fs.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise AggregationError(f"cannot create aggregate folder {self.path}: {e}") from None

    def file(self, name: str) -> str:
        return f"{self.path}/{name}"

    def put(self, name: str, data: bytes) -> None:
        """Publish ``data`` as ``name`` at once: a reader sees the old file, no file, or all of ``data``."""
        target = self.file(name)
        try:
            if self.local:
                # Through self.io, so that each create, rename and delete is one counted operation.
                write_atomically(target, lambda f: f.write(data), self.io)
            else:
                self.io.put(target, data)
        except OSError as e:
            raise AggregationError(f"cannot write {target}: {e}") from None

    def write(self, name: str, data: bytes) -> None:
        """Write ``data`` as ``name`` in one operation; on a filesystem in place, so a reader may see a write in progress.

        For files whose readers take only a whole record (parts: ``records.decode_part``
        checks a SHA-256 over the file); on an object store a PUT is atomic anyway.
        """
        target = self.file(name)
        try:
            (self.io.write if self.local else self.io.put)(target, data)
        except OSError as e:
            raise AggregationError(f"cannot write {target}: {e}") from None

    def get(self, name: str) -> bytes | None:
        """The file's bytes, or None when it does not exist (yet)."""
        try:
            return self.io.read(self.file(name))
        except OSError as e:
            raise AggregationError(f"cannot read {self.file(name)}: {e}") from None

    def get_many(self, names: list[str]) -> dict[str, bytes]:
        """Several files (concurrently on an object store); missing ones are left out."""
        if self.local or len(names) < 2:
            found = {n: self.get(n) for n in names}
            return {n: v for n, v in found.items() if v is not None}
        by_path = {self.file(n): n for n in names}
        try:
            raw = self.io.read_many(list(by_path))
        except OSError as e:
            raise AggregationError(f"cannot read in {self.path}: {e}") from None
        return {by_path.get(p, p.rsplit("/", 1)[-1]): v for p, v in raw.items()}

    def names(self) -> list[str]:
        return self.io.listdir(self.path)

    def remove(self, names: list[str]) -> None:
        if not names:
            return
        if self.local:
            for n in names:
                try:
                    self.io.delete(self.file(n))
                except OSError:
                    pass
        else:
            self.io.delete_many([self.file(n) for n in names])
