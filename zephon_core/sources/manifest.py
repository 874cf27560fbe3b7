"""The index manifest of a many-file source: one object next to the data that every rank reads
instead of opening every file.

``zephon-manifest.json`` in the source's root folder records, per file, its name,
size, ETag or modification time, content sample and document count (and format
facts such as Parquet row groups); ``.zephon-index/<file>.npz`` holds a file's
document offsets where a format needs them. ``zephon index SOURCE`` writes both.
On a file system a pipeline validates the manifest against one listing of the
files: a file added, removed or changed since (size or ETag; a new modification
time with a different content sample) is an error naming it, never silently wrong
data. On an object store the manifest is the file set (no listing: one request,
not one per 1,000 objects on every rank), and every read checks the version it got
(``read_unlisted``).
"""

from __future__ import annotations

import io
import json
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np

from zephon_core.errors import DataError
from zephon_core.io.atomic import put_atomically
from zephon_core.io.files import INDEX_DIR, MANIFEST, FileSet, FileStat, manifest_scope
from zephon_core.io.fs import content_fingerprint
from zephon_core.io.remote import serves_versions

FORMAT, VERSION = "zephon.manifest", 1


@dataclass(frozen=True)
class ShardMeta:
    """What a source needs to know of one file without opening it (a manifest entry)."""

    name: str  # relative to the source's root folder
    size: int
    documents: int
    sample_blake2b: str  # the hash of its first and last MiB (io.fs.content_fingerprint)
    etag: str | None = None
    mtime: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # format-specific facts (e.g. Parquet row groups)

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "size": self.size, "documents": self.documents, "sample_blake2b": self.sample_blake2b}
        out.update({k: v for k, v in (("etag", self.etag), ("mtime", self.mtime)) if v is not None})
        if self.extra:
            out["extra"] = self.extra
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ShardMeta:
        return cls(str(d["name"]), int(d["size"]), int(d["documents"]), str(d["sample_blake2b"]), d.get("etag"), d.get("mtime"), dict(d.get("extra") or {}))


def _join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}" if root else name


def write_manifest(files: FileSet, kind: str, options: Mapping[str, Any], metas: Sequence[ShardMeta],
                   indexes: Mapping[str, Mapping[str, np.ndarray]] | None = None) -> str:
    """Write the manifest (and each file's index arrays) into the source's root; returns the manifest's URL."""
    for name, arrays in (indexes or {}).items():
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as its bool flag
        put_atomically(files.fs, _join(files.root, f"{INDEX_DIR}/{name}.npz"), buf.getvalue())
    body = {"format": FORMAT, "version": VERSION, "kind": kind, "options": dict(options), "files": [m.to_json() for m in metas]}
    path = _join(files.root, MANIFEST)
    put_atomically(files.fs, path, json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    return str(files.fs.unstrip_protocol(path))


def read_index(files: FileSet, name: str, keys: Sequence[str] = ()) -> dict[str, np.ndarray] | None:
    """A file's index arrays written with the manifest, or None; ``keys``: the arrays it must hold, exactly.
    A damaged file is a ``DataError`` naming it and the fix."""
    path = _join(files.root, f"{INDEX_DIR}/{name}.npz")
    try:
        data = files.fs.cat_file(path)
    except FileNotFoundError:
        return None
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}  # every member read whole: its CRC checked
        if keys and sorted(arrays) != sorted(keys):
            raise KeyError(f"it holds the arrays {sorted(arrays)}, not {sorted(keys)}")
        return arrays
    except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, KeyError, IndexError,
            NotImplementedError) as e:
        why = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        raise DataError(f"{files.fs.unstrip_protocol(path)}: a damaged index file ({why}); write the manifest again: "
                        f"zephon index {files.fs.unstrip_protocol(files.root)}") from None


def _load(fs: fsspec.AbstractFileSystem, root: str, kind: str, options: Mapping[str, Any]) -> tuple[str, list[ShardMeta]] | None:
    """The manifest in ``root`` (its URL and entries) if there is one, built for this kind of source with these options."""
    path = _join(root, MANIFEST)
    url = str(fs.unstrip_protocol(path))
    try:
        raw = fs.cat_file(path)
    except FileNotFoundError:
        return None
    try:
        body = json.loads(raw)
        if body.get("format") != FORMAT or body.get("version") != VERSION:
            raise DataError(f"{url}: not a Zephon index manifest of version {VERSION}; rebuild it with `zephon index`")
        entries = [ShardMeta.from_json(d) for d in body["files"]]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise DataError(f"{url}: unreadable index manifest ({e}); rebuild it with `zephon index`") from None
    if body.get("kind") != kind or body.get("options") != dict(options):
        raise DataError(f"{url}: the manifest was built for a {body.get('kind')} source with {body.get('options')}, this source is a {kind} "
                        f"source with {dict(options)}; rebuild it with `zephon index`")
    return url, entries


def read_manifest(files: FileSet, kind: str, options: Mapping[str, Any]) -> list[ShardMeta] | None:
    """The manifest's entries for ``files``, validated against the listing; None when there is no manifest."""
    found = _load(files.fs, files.root, kind, options)
    return None if found is None else _validated(files, *found)


def read_unlisted(path: str | Sequence[str], suffixes: Sequence[str], storage_options: dict[str, Any] | None, kind: str,
                  options: Mapping[str, Any]) -> tuple[FileSet, list[ShardMeta]] | None:
    """On an object store, a glob's or folder's file set from its manifest alone: one request.

    A listing costs one request per 1,000 objects on every rank. Instead, each
    object is checked when read: every GET says which version (ETag) and size it
    served, and one that differs from the manifest's is a ``DataError`` naming it
    (``remote.fetch_range``). A file added since ``zephon index`` is not seen
    (``zephon index --check`` or ``Access(verify_listing=True)`` lists and compares).
    None where this does not apply: a local file system (listing it is cheap), a
    file or a list of paths, no manifest, or a manifest without ETags.
    """
    scope = manifest_scope(path, suffixes, storage_options)
    if scope is None or not serves_versions(scope[0]):
        return None
    fs, root, covers = scope
    found = _load(fs, root, kind, options)
    if found is None:
        return None
    entries = sorted((m for m in found[1] if covers(_join(root, m.name))), key=lambda m: m.name)
    if not entries or any(m.etag is None for m in entries):
        return None
    stats = tuple(FileStat(_join(root, m.name), m.size, m.etag, m.mtime) for m in entries)
    return FileSet(fs, root, stats, expanded=True, listed=False), entries


def _validated(files: FileSet, url: str, entries: list[ShardMeta]) -> list[ShardMeta]:
    by_name = {m.name: m for m in entries}
    listed = {files.name(st): st for st in files.files}
    added = sorted(set(listed) - set(by_name))
    if added:
        raise DataError(f"{url}: stale: file {added[0]} is not in the manifest ({len(added)} new file(s)); rebuild it with `zephon index`")
    gone = sorted(set(by_name) - set(listed))
    if gone:
        raise DataError(f"{url}: stale: file {gone[0]} is in the manifest but no longer there ({len(gone)} missing); rebuild it with `zephon index`")
    out = []
    for name, st in listed.items():
        m = by_name[name]
        if not _same(files, st, m):
            raise DataError(f"{url}: stale: file {name} changed since the manifest was written (size {m.size} -> {st.size}, "
                            f"etag {m.etag} -> {st.etag}); rebuild it with `zephon index`")
        out.append(ShardMeta(m.name, m.size, m.documents, m.sample_blake2b, st.etag, st.mtime, m.extra))
    return out


def _same(files: FileSet, st: FileStat, m: ShardMeta) -> bool:
    if st.size != m.size:
        return False
    if st.etag is not None and m.etag is not None:
        return st.etag == m.etag
    if st.mtime is not None and m.mtime is not None and st.mtime != m.mtime:
        # Touched or copied: trust it only if its content sample is unchanged.
        return bool(content_fingerprint(files.fs, st.path)["sample_blake2b"] == m.sample_blake2b)
    return True
