"""The per-file template of a format whose files are read through the byte layer.

``StoredFile`` owns what every such format repeated: the name, the file system, the fingerprint
sample (from a manifest entry, a small object fetched whole, or the file's ends) and the byte
access (``byte_access.open_bytes``: local, object store, decompressed or copied into the shard
cache). A format supplies its fingerprint options, its compression rule and ``_open`` (what it
reads of a file at start-up: Parquet its footer, an MDS shard its header); a format whose own
manifest states each file (MDS's ``index.json``) also gives its fingerprint sample (``_sample``)
and picks the stored file it reads (``_open_bytes``). ``IndexedFile``, for a format whose documents
are byte ranges found by one scan, adds the versioned index cache and the index arrays: such a
format supplies its scan (``_build_index``), what makes an index plausible for a file, and its reads.

The index cache has one key rule for every format: the entry is named by the file's URL and the
format's variant (``kind`` and its options), and holds the file's fingerprint and version (the
listing's ETag or modification time): the fingerprint samples only a file's ends, so an index is
never reused for a file edited in the middle. Without a known version nothing is cached.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from zephon_core.io import index_cache
from zephon_core.io.byte_access import ByteReader, compression_of, file_sample, open_bytes
from zephon_core.io.files import DEFAULT_ACCESS, Access, FileStat
from zephon_core.io.fs import default_name, open_fs, shown
from zephon_core.sources.base import Source
from zephon_core.sources.manifest import ShardMeta


class StoredFile(Source):
    """One file of a format, read through the byte layer (``self._bytes``)."""

    #: The kind its fingerprint records (the format's ``kind``).
    kind: ClassVar[str]

    def __init__(self, path: str, *, name: str | None = None, storage_options: dict[str, Any] | None = None,
                 access: Access = DEFAULT_ACCESS, known: ShardMeta | None = None,
                 index: dict[str, np.ndarray] | None = None, stat: FileStat | None = None,
                 allow_empty: bool = False) -> None:
        self.path = shown(str(path))  # what its messages name (a many-file source opens local files by URL)
        self.name = name or default_name(self.path)
        self._fs, self._fspath = open_fs(self.path, storage_options)
        sample, whole = self._sample(access, stat, known)
        self._fingerprint: dict[str, Any] = {"kind": self.kind, **self.options(), **sample}
        self._bytes: ByteReader = self._open_bytes(access, stat, sample)
        self._open(access, index, stat, whole)
        if not allow_empty:
            self._require_nonempty(self.path)

    # -- what a format supplies ------------------------------------------------------------------------
    def options(self) -> dict[str, Any]:
        """The format's settings that its fingerprint (and the index cache's variant) records."""
        return {}

    def compression(self, fspath: str) -> str | None:
        """The compression a file's name says (``byte_access.COMPRESSIONS``)."""
        return compression_of(fspath)

    def _sample(self, access: Access, stat: FileStat | None,
                known: ShardMeta | None) -> tuple[dict[str, Any], bytes | None]:
        """The fingerprint sample (``size``, ``sample_blake2b``) and the file's bytes where a small object was
        fetched whole: ``byte_access.file_sample``. A format whose data states its files itself (MDS's
        ``index.json``) answers from that statement instead."""
        return file_sample(self._fs, self._fspath, stat, access, known)

    def _open_bytes(self, access: Access, stat: FileStat | None, sample: dict[str, Any]) -> ByteReader:
        """The file's bytes, decompressed as ``compression`` says. A format whose data names more than one
        file for a document set (MDS: a compressed shard and its raw twin) picks the file to read here."""
        return open_bytes(self._fs, self._fspath, int(sample["size"]), str(sample["sample_blake2b"]), access, stat,
                          self.compression(self._fspath))

    def _open(self, access: Access, index: dict[str, np.ndarray] | None, stat: FileStat | None,
              whole: bytes | None) -> None:
        """Read what the file's documents need (``index``: a manifest's, ``whole``: its bytes, where a small
        object was fetched whole); a file that is not of the format is a ``DataError`` naming it."""
        raise NotImplementedError

    def fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)


class IndexedFile(StoredFile):
    """One file of a format read through its index (byte offsets of its documents, built by one scan)."""

    # -- what a format supplies ------------------------------------------------------------------------
    def _build_index(self, whole: bytes | None = None) -> dict[str, np.ndarray]:
        """The index from one scan of the file (``whole``: its bytes, where a small object was fetched whole)."""
        raise NotImplementedError

    def _plausible(self, arrays: dict[str, np.ndarray]) -> bool:
        """Whether ``arrays`` (from a manifest or the cache) can describe this file."""
        raise NotImplementedError

    # -- the template ----------------------------------------------------------------------------------
    def _open(self, access: Access, index: dict[str, np.ndarray] | None, stat: FileStat | None,
              whole: bytes | None) -> None:
        self._index = self._load_index(access, index, stat, whole)

    def _version(self, stat: FileStat | None) -> Any:
        """The file's version: the listing's ETag or modification time, else the file system's (None: unknown)."""
        if stat is not None and (stat.etag or stat.mtime):
            return stat.etag or stat.mtime
        try:
            info = self._fs.info(self._fspath)
            return info.get("ETag") or info.get("mtime") or self._fs.modified(self._fspath).timestamp()
        except (NotImplementedError, AttributeError, OSError):
            return None

    def _load_index(self, access: Access, given: dict[str, np.ndarray] | None, stat: FileStat | None,
                    whole: bytes | None) -> dict[str, np.ndarray]:
        """A manifest's index if it fits the file, else the cached one, else one scan (then cached)."""
        if given is not None and self._plausible(given):
            return given
        version = self._version(stat)
        variant = ":".join([self.kind, *map(str, self.options().values())])  # "jsonl:text", "webdataset:txt"
        url = self._fs.unstrip_protocol(self._fspath)
        cache_file = index_cache.cache_path(index_cache.cache_root(access.cache_dir), url, variant)
        key = {**self._fingerprint, "version": str(version)}
        cached = index_cache.load(cache_file, key) if version is not None else None
        if cached is not None and self._plausible(cached):
            return cached
        arrays = self._build_index(whole)
        if version is not None:
            index_cache.store(cache_file, key, arrays)
        return arrays

    @property
    def index_arrays(self) -> dict[str, np.ndarray]:
        """The file's index (what a manifest stores next to the data)."""
        return dict(self._index)

    def __len__(self) -> int:
        return len(self._index["starts"])

    def byte_lengths(self) -> np.ndarray | None:
        """Stored bytes of every document (a format whose index spans more than one document has none)."""
        return self._index["lengths"]

    def _spans(self, indices: Any) -> list[bytes]:
        """The stored bytes of documents ``indices``, in order: one ``read_many`` of their byte ranges."""
        starts, lengths = self._index["starts"], self._index["lengths"]
        return self._bytes.read_many([(int(starts[i]), int(lengths[i])) for i in indices])
