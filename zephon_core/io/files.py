"""The files of a source: a path, a glob, a directory or a list, always in sorted order.

A listing's order depends on the store (and on S3 on the key encoding), so the
file order of a source is the sorted order of the files' full paths, never the
order a listing returned.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.core import url_to_fs
from fsspec.utils import glob_translate

from zephon_core.errors import DataError

_GLOB_CHARS = frozenset("*?[")
INDEX_DIR = ".zephon-index"  # a folder's per-file index sidecars (``zephon index``): never part of its file set
MANIFEST = "zephon-manifest.json"  # a folder's index manifest (``zephon index``): nor is it


def is_index_file(path: str) -> bool:
    """Whether ``path`` is a manifest or an index sidecar (what ``zephon index`` writes), which a glob must not pick up."""
    return path.rsplit("/", 1)[-1] == MANIFEST or f"/{INDEX_DIR}/" in f"/{path}"


@dataclass(frozen=True)
class FileStat:
    """What a listing says of one file: enough to tell that it changed."""

    path: str  # inside the filesystem (no protocol)
    size: int
    etag: str | None = None  # object stores
    mtime: float | None = None  # filesystems


@dataclass(frozen=True)
class FileSet:
    """The sorted files of one source, on one filesystem."""

    fs: fsspec.AbstractFileSystem
    root: str  # the folder the files are named relative to (where a manifest lives)
    files: tuple[FileStat, ...]
    expanded: bool  # a glob, a folder or a list: a many-file source, even if it holds one file
    listed: bool = True  # False: the files are its manifest's, not a listing's (see manifest.read_unlisted)

    def url(self, stat: FileStat) -> str:
        return str(self.fs.unstrip_protocol(stat.path))

    def name(self, stat: FileStat) -> str:
        """The file's name relative to ``root`` (what manifests and fingerprints record)."""
        rel = stat.path[len(self.root):].lstrip("/") if stat.path.startswith(self.root) else stat.path
        return rel or os.path.basename(stat.path)


def _stat(info: dict[str, Any]) -> FileStat:
    etag = info.get("ETag") or info.get("etag")
    mtime = info.get("mtime") or info.get("LastModified")
    if mtime is not None and not isinstance(mtime, (int, float)):
        mtime = mtime.timestamp() if hasattr(mtime, "timestamp") else None
    return FileStat(str(info["name"]), int(info.get("size") or 0), str(etag).strip('"') if etag else None, mtime)


def _matches(path: str, suffixes: Sequence[str]) -> bool:
    return any(path.endswith(s) for s in suffixes)


def _glob_root(pattern: str) -> str:
    """The folder a glob's files are named relative to: its part before the first wildcard."""
    return pattern[: min(pattern.find(c) for c in _GLOB_CHARS if c in pattern)].rsplit("/", 1)[0]


def _find(fs: fsspec.AbstractFileSystem, folder: str) -> dict[str, dict[str, Any]]:
    """Every file under ``folder``, recursively, except the index sidecars: walking folder by folder
    lists each level once (one delimited listing on an object store) and skips the sidecars'
    folder, which holds as many objects as the data."""
    out: dict[str, dict[str, Any]] = {}
    fs.invalidate_cache(folder)  # a listing cached earlier in this process could hide a changed shard
    for _, dirs, files in fs.walk(folder, detail=True):
        dirs.pop(INDEX_DIR, None)  # in place: walk does not descend into it
        out.update({str(i["name"]): i for i in files.values()})
    return out


def list_files(path: str | Sequence[str], suffixes: Sequence[str], storage_options: dict[str, Any] | None = None) -> FileSet:
    """Expand ``path`` (one file, a glob, a folder: its files ending in ``suffixes``, recursively, or a list of any of them)."""
    specs = [str(path)] if isinstance(path, (str, os.PathLike)) else [str(p) for p in path]
    if not specs:
        raise DataError("a source needs at least one path", recipe_key="path")
    fs, _ = url_to_fs(specs[0], **(storage_options or {}))
    found: dict[str, FileStat] = {}
    roots = []
    expanded = not isinstance(path, (str, os.PathLike)) or len(specs) > 1
    for spec in specs:
        _, inner = url_to_fs(spec, **(storage_options or {}))  # (open_fs would expand a glob)
        if _GLOB_CHARS & set(inner):
            root = _glob_root(inner)
            fs.invalidate_cache(root)
            hits = {p: i for p, i in fs.glob(inner, detail=True).items() if i.get("type") != "directory" and not is_index_file(str(i["name"]))}
            roots.append(root)
            found.update({str(i["name"]): _stat(i) for i in hits.values()})
            if not hits:
                raise DataError(f"{spec}: no file matches this pattern", recipe_key="path")
            expanded = True
            continue
        try:
            info = fs.info(inner)
        except FileNotFoundError:
            raise DataError(f"{spec}: no such file or folder", recipe_key="path") from None
        if info.get("type") == "directory":
            roots.append(inner.rstrip("/"))
            hits = {p: i for p, i in _find(fs, inner).items() if _matches(p, suffixes)}
            if not hits:
                raise DataError(f"{spec}: a folder with no {' or '.join(suffixes)} file in it", recipe_key="path")
            found.update({str(i["name"]): _stat(i) for i in hits.values()})
            expanded = True
        else:
            roots.append(inner.rsplit("/", 1)[0] if "/" in inner else "")
            found[str(info["name"])] = _stat(info)
    root = os.path.commonpath(roots) if len(set(roots)) > 1 else roots[0]
    return FileSet(fs, root, tuple(found[p] for p in sorted(found)), expanded)


def manifest_scope(path: str | Sequence[str], suffixes: Sequence[str],
                   storage_options: dict[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str, Callable[[str], bool]] | None:
    """Where the manifest of a single glob or folder is, and which of its files' paths the glob or
    folder covers, found without a request; None for a file or a list (they are listed)."""
    if not isinstance(path, (str, os.PathLike)):
        return None
    fs, inner = url_to_fs(str(path), **(storage_options or {}))
    if _GLOB_CHARS & set(inner):
        root = _glob_root(inner)
        pattern = re.compile(glob_translate(inner))  # fsspec's own glob semantics, as fs.glob matches
        return fs, root, lambda p: pattern.match(p) is not None and not is_index_file(p)
    if _matches(inner, suffixes):
        return None  # one file
    root = inner.rstrip("/")
    return fs, root, lambda p: p.startswith(root + "/") and _matches(p, suffixes) and not is_index_file(p)


@dataclass(frozen=True)
class Access:
    """How a source reads its files: never changes what it reads."""

    attempts: int = 5  # per range request on an object store, before a DataError
    cache_dir: str | None = None  # the index cache (default $ZEPHON_CACHE_DIR or ~/.cache/zephon/index)
    cache_bytes: int | None = None  # the node-local shard cache's byte cap (default $ZEPHON_SHARD_CACHE_BYTES or 64 GiB)
    local_copy: bool = False  # copy whole objects into the shard cache before reading them
    manifest: bool = True  # use the folder's zephon-manifest.json when there is one
    verify_listing: bool = False  # on an object store, list the files too and refuse any not in the manifest
    progress: Callable[[int, int], None] | None = None  # (files indexed, files) while indexing many files
    # Files a many-file source keeps open at once, least recently read closed first: each holds a descriptor or
    # three (memory maps, handles), and an epoch over 10,000 shards would otherwise hold them all, past
    # common `ulimit -n` limits (1,024).
    max_open_files: int = 256


DEFAULT_ACCESS = Access()
