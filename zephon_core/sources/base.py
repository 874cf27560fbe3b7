"""The random-access source interface and the helpers every format shares."""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import fsspec
import numpy as np

from zephon_core.errors import DataError

# Bytes hashed at each end of a file for its fingerprint: a change in size or
# near either end is caught without reading a whole corpus at start-up.
_SAMPLE_BYTES = 1 << 20


class Source(ABC):
    """A random-access collection of documents.

    A document is either text (``str``), a JSON record (``dict``) or a 1-D
    integer token array, depending on the format. Implementations must be
    safe to ``read`` from several threads at once.

    A pretokenized source may also define ``read_flat(indices, headroom=0)``
    returning the documents end to end as one int64 array, after ``headroom``
    unused slots, and their lengths; pipelines without per-document operators
    then pack from it without building one array per document, and cut rows
    out of it without copying them again.
    """

    #: Short, human-readable name; defaults to the file's base name.
    name: str

    @abstractmethod
    def __len__(self) -> int:
        """Number of documents."""

    @abstractmethod
    def read(self, indices: Sequence[int]) -> list[Any]:
        """Documents at ``indices``, in that order."""

    @abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """Everything that identifies this source's content, JSON-serialisable.

        Checkpoints record it; a restore refuses a pipeline whose sources'
        fingerprints differ. It deliberately leaves the path out so that a
        corpus may be moved or copied between a run and its resume.
        """

    def token_lengths(self) -> np.ndarray | None:
        """Tokens of every document (int64), where the source knows them without reading documents.

        Pretokenized sources answer from their index; token-weighted mixtures
        (``weight_by="tokens"``) then weigh sources by exact token counts.
        """
        return None

    def byte_lengths(self) -> np.ndarray | None:
        """Stored bytes of every document (int64), where the source knows them without reading documents.

        Token-weighted mixtures estimate a text document's tokens from its size
        (``zephon_core.curriculum.token_index``); None: every document counts
        as the source's sampled mean.
        """
        return None

    def describe(self) -> str:
        """One line for ``explain()``."""
        return f"{type(self).__name__}({self.name!r}, {len(self)} documents)"

    def _require_nonempty(self, where: str) -> None:
        if len(self) == 0:
            raise DataError(f"{where}: source has no documents")


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
        from zephon_core.sources.remote import fetch_range

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


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending (``np.unique``); one comparison pass in the common case of a single value."""
    if len(values) and (values == values[0]).all():
        return values[:1].copy()
    return np.unique(values)


def read_flat_grouped(groups: np.ndarray, read: Callable[[int, np.ndarray | slice, int], tuple[np.ndarray, np.ndarray]],
                      headroom: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Documents read group by group, put back in their given order: ``read(g, where, room)`` returns
    the flat tokens, after ``room`` unused slots, and the lengths of the documents at positions
    ``where`` (those of group ``g``; a whole slice when there is one group, so the common case
    indexes nothing).

    Returns the flat tokens (int64, after ``headroom`` unused slots) and the lengths of every
    document, in the order of ``groups``.
    """
    kinds = distinct(groups)
    if len(kinds) == 1:
        return read(int(kinds[0]), slice(None), headroom)
    lengths = np.zeros(len(groups), dtype=np.int64)
    parts = []
    for g in kinds:
        where = np.flatnonzero(groups == g)
        part, part_len = read(int(g), where, 0)
        lengths[where] = part_len
        parts.append((where, part, part_len))
    tokens = np.empty(headroom + int(lengths.sum()), dtype=np.int64)
    starts = headroom + np.cumsum(lengths) - lengths
    for where, part, part_len in parts:
        tokens[gather_index(starts[where], part_len)] = part
    return tokens, lengths


def gather_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices of ``starts[j] .. starts[j] + lengths[j] - 1`` for every ``j``, end to end."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    idx = np.arange(total, dtype=np.int64)
    idx += np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths)
    return idx
