"""Megatron indexed datasets (``.bin``/``.idx`` pairs), local or on any fsspec store.

A local pair is memory-mapped, as Megatron reads it. On an object store the
``.idx`` (a few bytes per document) is copied once per node into the shard cache
and memory-mapped from there; the ``.bin`` is read in place through the byte
layer (``byte_access.open_bytes``): the documents of a batch are one
``read_many`` of coalesced, verified, retried range requests from the page pool,
each checked against the version (ETag) the listing or the manifest recorded.
A manifest (``zephon index``) records each pair's ``.bin`` size, sample and ETag,
so start-up opens no pair and a pair's ``.idx`` is fetched on its first read.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import fsspec
import numpy as np

from zephon_core.arrays import gather_index
from zephon_core.errors import DataError
from zephon_core.io.byte_access import ByteReader, open_bytes, reader_sample
from zephon_core.io.files import DEFAULT_ACCESS, Access, FileStat
from zephon_core.io.fs import content_fingerprint, default_name, is_local, open_fs
from zephon_core.io.remote import LocalBytes
from zephon_core.sources.base import Source
from zephon_core.sources.manifest import ShardMeta
from zephon_core.sources.registry import SourceArgs, register_format
from zephon_core.sources.sharded import FlatShardedSource
from zephon_core.sources.tokens import concat_slices, split_flat

# The Megatron indexed-dataset layout (megatron.core.datasets.indexed_dataset):
# "MMIDIDX\0\0", <Q version=1>, <B dtype code>, <Q sequence count>,
# <Q document-index count>, int32 lengths, int64 byte pointers, int64 document
# indices (sequence numbers at which documents start, beginning with 0).
_MAGIC = b"MMIDIDX\x00\x00"
_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
_HEADER = struct.Struct("<9sQBQQ")


def _read_index(reader: LocalBytes, where: str) -> tuple[np.dtype, np.ndarray, np.ndarray, np.ndarray]:
    """The field dtype, sequence lengths, byte pointers and document indices of the ``.idx`` in ``reader``."""
    (head,) = reader.read_many([(0, _HEADER.size)])
    if len(head) < _HEADER.size:
        raise DataError(f"{where}: truncated header ({len(head)} of {_HEADER.size} bytes)")
    magic, version, code, n_seq, n_doc_idx = _HEADER.unpack(head)
    if magic != _MAGIC:
        raise DataError(f"{where}: not a Megatron index (magic {magic!r})")
    if version != 1:
        raise DataError(f"{where}: unsupported index version {version}")
    if code not in _DTYPES or code in (6, 7):
        raise DataError(f"{where}: field dtype code {code} is not an integer token type")
    need = _HEADER.size + n_seq * (4 + 8) + n_doc_idx * 8
    if reader.size < need:
        raise DataError(f"{where}: truncated: {reader.size} bytes, the header's sequence_count={n_seq} and document_count={n_doc_idx} need {need}")
    mm = np.memmap(reader.path, mode="r", dtype=np.uint8)
    off = _HEADER.size
    lengths = np.frombuffer(mm, np.int32, n_seq, off)
    pointers = np.frombuffer(mm, np.int64, n_seq, off + 4 * n_seq)
    doc_index = np.frombuffer(mm, np.int64, n_doc_idx, off + 12 * n_seq)
    if n_doc_idx < 1 or doc_index[0] != 0 or doc_index[-1] != n_seq or np.any(np.diff(doc_index) < 0):
        raise DataError(f"{where}: field document_indices is not an ascending list from 0 to sequence_count={n_seq}")
    return np.dtype(_DTYPES[code]), lengths, pointers, doc_index


def _document_of(doc_index: np.ndarray, seq: int) -> int:
    return int(np.searchsorted(doc_index, seq, side="right") - 1)


def _check_data_size(dtype: np.dtype, lengths: np.ndarray, pointers: np.ndarray, doc_index: np.ndarray, bin_size: int, where: str) -> None:
    """The ``.bin`` holds exactly the bytes its index describes (Megatron writes sequences end to end)."""
    end = int(pointers[-1]) + int(lengths[-1]) * dtype.itemsize if len(lengths) else 0
    if bin_size < end:
        past = np.flatnonzero(pointers + lengths.astype(np.int64) * dtype.itemsize > bin_size)
        doc = _document_of(doc_index, int(past[0]))
        raise DataError(f"{where}: truncated: {bin_size} bytes, the index points up to byte {end} (document {doc} is the first past the end)")
    if bin_size != end:
        raise DataError(
            f"{where}: {bin_size} bytes, but its index describes {end} bytes of {dtype} tokens; "
            "the .bin and .idx do not belong together (or the index has the wrong field dtype)"
        )


def _stat(fs: fsspec.AbstractFileSystem, path: str, where: str, what: str) -> FileStat:
    try:
        info = fs.info(path)
    except FileNotFoundError:
        raise DataError(f"{where}: no such file ({what})") from None
    etag = info.get("ETag") or info.get("etag")
    return FileStat(path, int(info.get("size") or 0), str(etag).strip('"') if etag else None)


def _stale(where: str, recorded: dict[str, Any], now: dict[str, Any]) -> None:
    if recorded["size"] != now["size"] or recorded["sample_blake2b"] != now["sample_blake2b"]:
        raise DataError(f"{where}: stale: changed since the manifest was written (size {recorded['size']} -> {now['size']}, sample "
                        f"{recorded['sample_blake2b']} -> {now['sample_blake2b']}); rebuild it with `zephon index`")


class MegatronIndexedFile(Source):
    """A Megatron ``.bin``/``.idx`` pair as written by ``preprocess_data.py``, local or on a store.

    ``prefix`` is the path (or URL) without extension. A document is the concatenation
    of the sequences between two document indices, as Megatron defines it. ``stat`` is
    the ``.idx``'s listing or manifest entry; ``known`` its manifest entry, whose facts
    of the ``.bin`` spare a request for each; ``fs`` the store (default: the one ``prefix`` names).
    """

    def __init__(self, prefix: str, *, name: str | None = None, allow_empty: bool = False, storage_options: dict[str, Any] | None = None,
                 access: Access = DEFAULT_ACCESS, stat: FileStat | None = None, known: ShardMeta | None = None,
                 fs: fsspec.AbstractFileSystem | None = None) -> None:
        self.prefix = str(prefix)
        self.name = name or default_name(self.prefix)
        if fs is None:  # (a many-file source passes its own: one store client for all its pairs)
            fs, idx_path = open_fs(self.prefix + ".idx", storage_options)
        else:
            idx_path = stat.path if stat is not None else fs._strip_protocol(self.prefix + ".idx")
        facts = known.extra if known is not None and "bin" in known.extra else None
        idx = self._index_bytes(fs, idx_path, stat, access, facts)
        idx_fp = reader_sample(idx)
        if facts is not None:
            _stale(self.prefix + ".idx", {"size": idx_fp["size"], "sample_blake2b": facts["idx_sample"]}, idx_fp)
        self._dtype, self._lengths, self._pointers, self._doc_index = _read_index(idx, self.prefix + ".idx")
        self._bin, bin_fp, etag = self._data_bytes(fs, idx_path[: -len(".idx")] + ".bin", access, facts)
        _check_data_size(self._dtype, self._lengths, self._pointers, self._doc_index, self._bin.size, self.prefix + ".bin")
        self._flat: np.ndarray | None = None  # the .bin memory-mapped (a plain ndarray slices faster), when it is a local file
        if isinstance(self._bin, LocalBytes):
            self._flat = np.frombuffer(np.memmap(self._bin.path, mode="r", dtype=np.uint8), self._dtype) if self._bin.size else np.zeros(0, self._dtype)
        if not allow_empty:
            self._require_nonempty(self.prefix)
        self._fingerprint: dict[str, Any] = {"kind": MegatronIndexedSource.kind, "dtype": str(self._dtype), "idx": idx_fp, "bin": bin_fp}
        self._bin_etag = etag

    def _index_bytes(self, fs: fsspec.AbstractFileSystem, path: str, stat: FileStat | None, access: Access,
                     facts: dict[str, Any] | None) -> LocalBytes:
        """The ``.idx`` as a local file: itself, or its copy in the node's shard cache (fetched once per node)."""
        where = self.prefix + ".idx"
        try:
            if is_local(fs):
                reader: ByteReader = open_bytes(fs, path, 0, "", access)
            else:
                stat = stat or _stat(fs, path, where, "no Megatron index at this prefix")
                # The cache entry is named by the version: an ETag or a sample from the listing or the manifest, else one read.
                version = stat.etag or (facts or {}).get("idx_sample") or content_fingerprint(fs, path)["sample_blake2b"]
                reader = open_bytes(fs, path, stat.size, f"megatron-idx:{version}", replace(access, local_copy=True), stat)
        except OSError as e:
            raise DataError(f"{where}: cannot read ({e.strerror or e})") from None
        assert isinstance(reader, LocalBytes)
        return reader

    def _data_bytes(self, fs: fsspec.AbstractFileSystem, path: str, access: Access,
                    facts: dict[str, Any] | None) -> tuple[ByteReader, dict[str, Any], str | None]:
        """The ``.bin``'s reader, its size and sample, and its ETag on a store."""
        where = self.prefix + ".bin"
        try:
            if is_local(fs):
                reader: ByteReader = open_bytes(fs, path, 0, "", access)
                fp = reader_sample(reader)
                if facts is not None:
                    _stale(where, facts["bin"], fp)
                return reader, fp, None
            recorded = facts["bin"] if facts is not None else None
            st = FileStat(path, int(recorded["size"]), recorded.get("etag")) if recorded else _stat(fs, path, where, "the .idx has no .bin next to it")
            version = st.etag or (recorded or {}).get("sample_blake2b") or content_fingerprint(fs, path)["sample_blake2b"]
            reader = open_bytes(fs, path, st.size, f"megatron-bin:{version}", access, st)
            fp = {"size": st.size, "sample_blake2b": recorded["sample_blake2b"]} if recorded else reader_sample(reader)
            return reader, fp, st.etag
        except OSError as e:
            raise DataError(f"{where}: cannot read ({e.strerror or e})") from None

    def manifest_facts(self) -> dict[str, Any]:
        """What a manifest keeps of this pair beyond its ``.idx`` entry: the ``.bin``'s size, sample and ETag."""
        fp: dict[str, Any] = self._fingerprint
        return {"dtype": fp["dtype"], "idx_sample": fp["idx"]["sample_blake2b"], "bin": {**fp["bin"], "etag": self._bin_etag}}

    def __len__(self) -> int:
        return len(self._doc_index) - 1

    def read_flat(self, indices: np.ndarray, headroom: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The documents at ``indices`` end to end (int64, after ``headroom`` unused slots) and their lengths."""
        indices = np.asarray(indices, dtype=np.int64)
        first = self._doc_index[indices]
        counts = self._doc_index[indices + 1] - first
        if len(counts) and (counts == 1).all():  # the common layout: one sequence per document
            seq_lengths = self._lengths[first].astype(np.int64)
            return self._gather(first, seq_lengths, headroom), seq_lengths
        seqs = gather_index(first, counts)
        seq_lengths = self._lengths[seqs].astype(np.int64)
        # A document spans its sequences (none: length 0).
        cum = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(seq_lengths, out=cum[1:])
        first_seq = np.cumsum(counts) - counts
        lengths = cum[first_seq + counts] - cum[first_seq]
        return self._gather(seqs, seq_lengths, headroom), lengths

    def _gather(self, seqs: np.ndarray, seq_lengths: np.ndarray, headroom: int) -> np.ndarray:
        """Sequences ``seqs`` end to end as int64 after ``headroom`` slots: memory-mapped, or one coalesced ``read_many``."""
        size = self._dtype.itemsize
        starts = self._pointers[seqs]
        if len(seqs) and (int(starts.min()) < 0 or int(seq_lengths.min()) < 0 or int((starts + seq_lengths * size).max()) > self._bin.size):
            self._bad_pointer(seqs, seq_lengths)
        if self._flat is not None:
            return concat_slices(self._flat, starts // size, seq_lengths, headroom)
        out = np.empty(headroom + int(seq_lengths.sum()), dtype=np.int64)
        spans = [(a, n) for a, n in zip(starts.tolist(), (seq_lengths * size).tolist()) if n]
        if spans:
            out[headroom:] = np.frombuffer(b"".join(self._bin.read_many(spans)), self._dtype)
        return out

    def _bad_pointer(self, seqs: np.ndarray, seq_lengths: np.ndarray) -> None:
        ends = self._pointers[seqs] + seq_lengths * self._dtype.itemsize
        j = int(np.argmax((self._pointers[seqs] < 0) | (seq_lengths < 0) | (ends > self._bin.size)))
        s = int(seqs[j])
        raise DataError(f"{self.prefix}.idx: document {_document_of(self._doc_index, s)} (sequence {s}) points at bytes "
                        f"{int(self._pointers[s])}..{int(ends[j])} of {self.prefix}.bin, which has {self._bin.size}; the index is corrupt")

    def read(self, indices: Sequence[int]) -> list[Any]:
        return split_flat(*self.read_flat(np.asarray(indices, dtype=np.int64)))

    def token_lengths(self) -> np.ndarray:
        cum = np.zeros(len(self._lengths) + 1, dtype=np.int64)
        np.cumsum(self._lengths, out=cum[1:])
        return cum[self._doc_index[1:]] - cum[self._doc_index[:-1]]

    def fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)


def _prefix_spec(spec: str, storage_options: dict[str, Any] | None) -> str:
    """A prefix (or a glob of prefixes) names its ``.idx`` files; a folder stays a folder."""
    if spec.endswith(".idx") or spec.endswith("/"):
        return spec
    if set("*?[") & set(spec):
        return spec + ".idx"  # (open_fs would expand the glob, which names no file without its suffix)
    fs, inner = open_fs(spec, storage_options)
    return spec if fs.isdir(inner) else spec + ".idx"


@register_format
class MegatronIndexedSource(FlatShardedSource):
    """Megatron ``.bin``/``.idx`` datasets: one prefix, a glob of prefixes, a folder (its ``.idx``
    files, recursively) or a list of prefixes, in sorted order (``["a_text_document", "b_text_document"]``),
    on a local or shared file system (memory-mapped) or any fsspec store (``s3://...``).

    A single prefix keeps the single-dataset fingerprint, wherever it is read from.
    """

    format_name = "megatron"
    kind = "megatron_indexed"
    suffixes = (".idx",)
    path_endings = ("_document",)  # preprocess_data.py's prefixes: <name>_<key>_document
    pretokenized = True

    @classmethod
    def from_args(cls, args: SourceArgs) -> MegatronIndexedSource:
        return cls(args.path, name=args.name, storage_options=args.storage_options, access=args.access)

    @classmethod
    def explain_missing(cls, path: str) -> str | None:
        if "://" in path or set("*?[") & set(path) or os.path.exists(path + ".idx") or os.path.isdir(path):
            return None
        return (f"no Megatron indexed dataset at {path} (.bin/.idx); write it first with Megatron-LM's "
                "tools/preprocess_data.py (for the bundled corpus: python configs/megatron/make_indexed_corpus.py)")

    @classmethod
    def file_specs(cls, path: str | Sequence[str], storage_options: dict[str, Any] | None = None) -> str | Sequence[str]:
        if isinstance(path, (str, os.PathLike)):
            return _prefix_spec(str(path), storage_options)
        return [_prefix_spec(str(p), storage_options) for p in path]

    def __init__(self, prefix: str | Sequence[str], *, name: str | None = None, use_manifest: bool = True,
                 storage_options: dict[str, Any] | None = None, access: Access | None = None) -> None:
        self._init_files(self.file_specs(prefix, storage_options), name, storage_options, access or Access(manifest=use_manifest))
        if isinstance(prefix, (str, os.PathLike)):
            self.path = str(prefix)

    def open_file(self, url: str, meta: ShardMeta | None, single: bool, stat: FileStat | None = None) -> MegatronIndexedFile:
        return MegatronIndexedFile(url[: -len(".idx")], allow_empty=not single, storage_options=self.storage_options, access=self.access,
                                   stat=stat, known=meta, fs=self.files.fs)

    def meta_of(self, st: FileStat, opened: Source) -> ShardMeta:
        assert isinstance(opened, MegatronIndexedFile)
        fp = opened.fingerprint()
        sample = hashlib.blake2b(json.dumps([fp["dtype"], fp["idx"], fp["bin"]], sort_keys=True).encode(), digest_size=16).hexdigest()
        return ShardMeta(self.files.name(st), st.size, len(opened), sample, st.etag, st.mtime, opened.manifest_facts())
