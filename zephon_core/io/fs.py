"""Where a path's bytes live (a file system or an object store, through fsspec) and a file's content sample."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import fsspec

from zephon_core.errors import DataError
from zephon_core.io.remote import fetch_range

# Bytes hashed at each end of a file for its fingerprint: a change in size or
# near either end is caught without reading a whole corpus at start-up.
_SAMPLE_BYTES = 1 << 20


def open_fs(path: str, storage_options: dict[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and the path inside it for a plain path or fsspec URL."""
    fs, _, paths = fsspec.get_fs_token_paths(path, storage_options=storage_options or {})
    return fs, paths[0]


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def sample_digest(data: bytes) -> str:
    """``content_fingerprint``'s sample hash of a whole file held in memory (the same value)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(data[:_SAMPLE_BYTES])
    if len(data) > _SAMPLE_BYTES:
        h.update(data[max(_SAMPLE_BYTES, len(data) - _SAMPLE_BYTES):])
    return h.hexdigest()


def sample_spans(size: int) -> list[tuple[int, int]]:
    """The ``(start, length)`` spans of a file of ``size`` bytes that its content sample hashes, in order."""
    spans = [(0, min(size, _SAMPLE_BYTES))] if size else []
    if size > _SAMPLE_BYTES:
        tail = max(_SAMPLE_BYTES, size - _SAMPLE_BYTES)
        spans.append((tail, size - tail))
    return spans


def content_fingerprint(fs: fsspec.AbstractFileSystem, path: str) -> dict[str, Any]:
    """Size plus a hash of the first and last MiB of one file."""
    try:
        size = int(fs.size(path))
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    h = hashlib.blake2b(digest_size=16)
    if not is_local(fs):  # verified, retried ranges: a store's stream can end early on a failed request
        if size:
            h.update(fetch_range(fs, path, 0, min(size, _SAMPLE_BYTES)))
        if size > _SAMPLE_BYTES:
            h.update(fetch_range(fs, path, max(_SAMPLE_BYTES, size - _SAMPLE_BYTES), size))
        return {"size": size, "sample_blake2b": h.hexdigest()}
    with fs.open(path, "rb") as f:
        h.update(f.read(_SAMPLE_BYTES))
        if size > 2 * _SAMPLE_BYTES:
            f.seek(size - _SAMPLE_BYTES)
            h.update(f.read(_SAMPLE_BYTES))
        elif size > _SAMPLE_BYTES:
            h.update(f.read())
    return {"size": size, "sample_blake2b": h.hexdigest()}


def default_name(path: str) -> str:
    return os.path.basename(path.rstrip("/")) or path


def shown(path: str) -> str:
    """How a message names a file: a local one by its path rather than as a ``file://`` URL, any other by its URL."""
    return path.removeprefix("file://") if path.startswith("file:///") else path
