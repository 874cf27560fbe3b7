"""Pretokenized documents: NumPy token arrays and Megatron indexed datasets.

Both are memory-mapped, so opening a corpus of any size costs only its index.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon_core.errors import ConfigError, DataError
from zephon_core.sources.base import Source, content_fingerprint, default_name, gather_index, is_local, open_fs
from zephon_core.sources.files import Access, FileStat
from zephon_core.sources.manifest import ShardMeta
from zephon_core.sources.registry import FileSource, SourceArgs, register_format
from zephon_core.sources.sharded import FlatShardedSource


def _local_path(path: str) -> str:
    fs, p = open_fs(path)
    if not is_local(fs):
        raise DataError(f"{path}: token arrays are memory-mapped and must be on a local or shared filesystem")
    return p


def _check_offsets(offsets: np.ndarray, n_tokens: int, where: str) -> None:
    if offsets.ndim != 1 or offsets.size < 2:
        raise DataError(f"{where}: document offsets must be a 1-D array of at least 2 entries")
    if not np.issubdtype(offsets.dtype, np.integer):
        raise DataError(f"{where}: document offsets must be integers, got {offsets.dtype}")
    if offsets[0] != 0 or offsets[-1] != n_tokens:
        raise DataError(f"{where}: document offsets must start at 0 and end at the token count {n_tokens}, got {int(offsets[0])}..{int(offsets[-1])}")
    if np.any(np.diff(offsets) < 0):
        bad = int(np.argmax(np.diff(offsets) < 0))
        raise DataError(f"{where}: document offsets decrease at entry {bad + 1}")


def _plain(a: np.ndarray) -> np.ndarray:
    """The same memory as a base C-contiguous ``ndarray`` (a strided array is copied once): fancy indexing a
    ``np.memmap`` subclass is several times slower, and ``_concat`` slices the raw buffer."""
    return np.frombuffer(a, a.dtype) if isinstance(a, np.memmap) and a.flags.c_contiguous else np.ascontiguousarray(a)


def _concat(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, headroom: int = 0) -> np.ndarray:
    """``flat[starts[j]:starts[j] + lengths[j]]`` for every ``j``, end to end, as int64, after ``headroom`` unused slots.

    ``flat`` is C-contiguous. Documents are hundreds of tokens long, so the cost is
    per document, not per token: each is cut as a slice of the raw buffer (a
    memoryview slice costs less than half an ndarray view), the slices are joined
    once and widened to int64 in one pass. A fancy-index gather would need three
    passes to build its index.
    """
    out = np.empty(headroom + int(lengths.sum()), dtype=np.int64)
    if len(starts):
        size = flat.itemsize
        raw = memoryview(flat).cast("B")
        lo, hi = (starts * size).tolist(), ((starts + lengths) * size).tolist()
        out[headroom:] = np.frombuffer(b"".join([raw[a:b] for a, b in zip(lo, hi)]), flat.dtype)
    return out


def _split(tokens: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """``read_flat``'s output as one array per document."""
    return np.split(tokens, np.cumsum(lengths)[:-1]) if len(lengths) else []


@register_format
class TokenArraySource(FileSource):
    """Documents as slices of one token array.

    ``tokens`` is a ``.npy`` file (or array) of integer token ids and
    ``offsets`` a ``.npy`` file (or array) of ``n_documents + 1`` ascending
    positions into it: document ``d`` is ``tokens[offsets[d]:offsets[d+1]]``.
    """

    format_name = "token_array"
    kind = "token_array"
    suffixes = (".npy",)
    pretokenized = True

    @classmethod
    def check_args(cls, args: SourceArgs) -> tuple[str, str] | None:
        if not isinstance(args.path, str):
            return "paths", "a token_array source is one .npy pair; use path and offsets"
        if not args.offsets:
            return "offsets", "a token_array source needs the .npy file of document offsets"
        return None

    @classmethod
    def from_args(cls, args: SourceArgs) -> TokenArraySource:
        problem = cls.check_args(args)
        if problem is not None:
            raise ConfigError(f"{problem[0]}: {problem[1]}")
        assert isinstance(args.path, str) and args.offsets is not None
        return cls(args.path, args.offsets, name=args.name)

    def __init__(self, tokens: str | np.ndarray, offsets: str | np.ndarray, *, name: str | None = None) -> None:
        self.name = name or (default_name(tokens) if isinstance(tokens, str) else "tokens")
        where = tokens if isinstance(tokens, str) else self.name
        self._tokens = self._load(tokens, "tokens")
        raw_offsets = np.asarray(self._load(offsets, "offsets"))
        if self._tokens.ndim != 1 or not np.issubdtype(self._tokens.dtype, np.integer):
            raise DataError(f"{where}: tokens must be a 1-D integer array, got {self._tokens.dtype} with shape {self._tokens.shape}")
        _check_offsets(raw_offsets, len(self._tokens), offsets if isinstance(offsets, str) else f"{self.name} offsets")
        self._offsets = raw_offsets.astype(np.int64)
        self._flat = _plain(self._tokens)
        self._paths = (tokens, offsets) if isinstance(tokens, str) and isinstance(offsets, str) else None
        self._require_nonempty(where)
        self._fingerprint = self._compute_fingerprint()

    @staticmethod
    def _load(x: str | np.ndarray, what: str) -> np.ndarray:
        if not isinstance(x, str):
            return np.asarray(x)
        try:
            return np.load(_local_path(x), mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DataError(f"{x}: cannot read the {what} array ({e})") from None

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def read(self, indices: Sequence[int]) -> list[Any]:
        return _split(*self.read_flat(np.asarray(indices, dtype=np.int64)))

    def token_lengths(self) -> np.ndarray:
        return np.diff(self._offsets)

    def read_flat(self, indices: np.ndarray, headroom: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The documents at ``indices`` end to end (int64, after ``headroom`` unused slots) and their lengths."""
        indices = np.asarray(indices, dtype=np.int64)
        starts = self._offsets[indices]
        lengths = self._offsets[indices + 1] - starts
        return _concat(self._flat, starts, lengths, headroom), lengths

    def fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)

    def _compute_fingerprint(self) -> dict[str, Any]:
        if self._paths is not None:
            parts = [content_fingerprint(*open_fs(p)) for p in self._paths]
        else:
            import hashlib

            parts = [{"blake2b": hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).hexdigest()} for a in (self._tokens, self._offsets)]
        return {"kind": self.kind, "dtype": str(self._tokens.dtype), "tokens": parts[0], "offsets": parts[1]}


# The Megatron indexed-dataset layout (megatron.core.datasets.indexed_dataset):
# "MMIDIDX\0\0", <Q version=1>, <B dtype code>, <Q sequence count>,
# <Q document-index count>, int32 lengths, int64 byte pointers, int64 document
# indices (sequence numbers at which documents start, beginning with 0).
_MAGIC = b"MMIDIDX\x00\x00"
_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
_HEADER = struct.Struct("<9sQBQQ")


class MegatronIndexedFile(Source):
    """A Megatron ``.bin``/``.idx`` pair as written by ``preprocess_data.py``.

    ``prefix`` is the path without extension. A document is the concatenation
    of the sequences between two document indices, as Megatron defines it.
    """

    def __init__(self, prefix: str, *, name: str | None = None, allow_empty: bool = False) -> None:
        self.prefix = str(prefix)
        self.name = name or default_name(self.prefix)
        self._idx_path = _local_path(self.prefix + ".idx")
        self._bin_path = _local_path(self.prefix + ".bin")
        self._read_index()
        if not allow_empty:
            self._require_nonempty(self.prefix)
        self._fingerprint = {
            "kind": MegatronIndexedSource.kind,
            "dtype": str(self._dtype),
            "idx": content_fingerprint(*open_fs(self._idx_path)),
            "bin": content_fingerprint(*open_fs(self._bin_path)),
        }

    def _read_index(self) -> None:
        idx = self._idx_path
        try:
            size = os.path.getsize(idx)
            with open(idx, "rb") as f:
                head = f.read(_HEADER.size)
        except OSError as e:
            raise DataError(f"{idx}: cannot read ({e.strerror})") from None
        if len(head) < _HEADER.size:
            raise DataError(f"{idx}: truncated header ({len(head)} of {_HEADER.size} bytes)")
        magic, version, code, n_seq, n_doc_idx = _HEADER.unpack(head)
        if magic != _MAGIC:
            raise DataError(f"{idx}: not a Megatron index (magic {magic!r})")
        if version != 1:
            raise DataError(f"{idx}: unsupported index version {version}")
        if code not in _DTYPES or code in (6, 7):
            raise DataError(f"{idx}: field dtype code {code} is not an integer token type")
        need = _HEADER.size + n_seq * (4 + 8) + n_doc_idx * 8
        if size < need:
            raise DataError(f"{idx}: truncated: {size} bytes, the header's sequence_count={n_seq} and document_count={n_doc_idx} need {need}")
        mm = np.memmap(idx, mode="r", dtype=np.uint8)
        off = _HEADER.size
        self._lengths = np.frombuffer(mm, np.int32, n_seq, off)
        self._pointers = np.frombuffer(mm, np.int64, n_seq, off + 4 * n_seq)
        self._doc_index = np.frombuffer(mm, np.int64, n_doc_idx, off + 12 * n_seq)
        self._dtype = np.dtype(_DTYPES[code])
        if n_doc_idx < 1 or self._doc_index[0] != 0 or self._doc_index[-1] != n_seq or np.any(np.diff(self._doc_index) < 0):
            raise DataError(f"{idx}: field document_indices is not an ascending list from 0 to sequence_count={n_seq}")
        try:
            bin_size = os.path.getsize(self._bin_path)
        except OSError as e:
            raise DataError(f"{self._bin_path}: cannot read ({e.strerror})") from None
        end = int(self._pointers[-1]) + int(self._lengths[-1]) * self._dtype.itemsize if n_seq else 0
        if bin_size < end:
            raise DataError(f"{self._bin_path}: truncated: {bin_size} bytes, the index points up to byte {end}")
        if bin_size != end:
            raise DataError(
                f"{self._bin_path}: {bin_size} bytes, but its index describes {end} bytes of {self._dtype} tokens; "
                "the .bin and .idx do not belong together (or the index has the wrong field dtype)"
            )
        self._bin = np.memmap(self._bin_path, mode="r", dtype=np.uint8) if bin_size else np.zeros(0, np.uint8)
        self._flat = np.frombuffer(self._bin, self._dtype) if bin_size else np.zeros(0, self._dtype)

    def __len__(self) -> int:
        return len(self._doc_index) - 1

    def read_flat(self, indices: np.ndarray, headroom: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The documents at ``indices`` end to end (int64, after ``headroom`` unused slots) and their lengths."""
        indices = np.asarray(indices, dtype=np.int64)
        first = self._doc_index[indices]
        counts = self._doc_index[indices + 1] - first
        if len(counts) and (counts == 1).all():  # the common layout: one sequence per document
            seq_lengths = self._lengths[first].astype(np.int64)
            return _concat(self._flat, self._pointers[first] // self._dtype.itemsize, seq_lengths, headroom), seq_lengths
        seqs = gather_index(first, counts)
        seq_lengths = self._lengths[seqs].astype(np.int64)
        # A document spans its sequences (none: length 0).
        cum = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(seq_lengths, out=cum[1:])
        first_seq = np.cumsum(counts) - counts
        lengths = cum[first_seq + counts] - cum[first_seq]
        starts = self._pointers[seqs] // self._dtype.itemsize
        return _concat(self._flat, starts, seq_lengths, headroom), lengths

    def read(self, indices: Sequence[int]) -> list[Any]:
        return _split(*self.read_flat(np.asarray(indices, dtype=np.int64)))

    def token_lengths(self) -> np.ndarray:
        cum = np.zeros(len(self._lengths) + 1, dtype=np.int64)
        np.cumsum(self._lengths, out=cum[1:])
        return cum[self._doc_index[1:]] - cum[self._doc_index[:-1]]

    def fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)


def _prefix_spec(spec: str) -> str:
    """A prefix (or a glob of prefixes) names its ``.idx`` files; a folder stays a folder."""
    fs, inner = open_fs(spec)
    return spec if spec.endswith(".idx") or ("*" not in spec and fs.isdir(inner)) else spec + ".idx"


@register_format
class MegatronIndexedSource(FlatShardedSource):
    """Megatron ``.bin``/``.idx`` datasets: one prefix, a glob of prefixes, a folder (its ``.idx``
    files, recursively) or a list of prefixes, in sorted order (``["a_text_document", "b_text_document"]``).

    Memory-mapped, so local or on a shared file system. A single prefix keeps the
    single-dataset fingerprint.
    """

    format_name = "megatron"
    kind = "megatron_indexed"
    suffixes = (".idx",)
    path_endings = ("_document",)  # preprocess_data.py's prefixes: <name>_<key>_document
    pretokenized = True

    @classmethod
    def from_args(cls, args: SourceArgs) -> MegatronIndexedSource:
        return cls(args.path, name=args.name, access=args.access)

    @classmethod
    def explain_missing(cls, path: str) -> str | None:
        if "://" in path or set("*?[") & set(path) or os.path.exists(path + ".idx") or os.path.isdir(path):
            return None
        return (f"no Megatron indexed dataset at {path} (.bin/.idx); write it first with Megatron-LM's "
                "tools/preprocess_data.py (for the bundled corpus: python configs/megatron/make_indexed_corpus.py)")

    @classmethod
    def file_specs(cls, path: str | Sequence[str]) -> str | Sequence[str]:
        return _prefix_spec(path) if isinstance(path, (str, os.PathLike)) else [_prefix_spec(str(p)) for p in path]

    def __init__(self, prefix: str | Sequence[str], *, name: str | None = None, use_manifest: bool = True, access: Access | None = None) -> None:
        self._init_files(self.file_specs(prefix), name, None, access or Access(manifest=use_manifest))
        if isinstance(prefix, (str, os.PathLike)):
            self.path = str(prefix)

    def open_file(self, url: str, meta: ShardMeta | None, single: bool, stat: FileStat | None = None) -> MegatronIndexedFile:
        return MegatronIndexedFile(url[: -len(".idx")], allow_empty=not single)

    def meta_of(self, st: FileStat, opened: Source) -> ShardMeta:
        fp = opened.fingerprint()
        sample = hashlib.blake2b(json.dumps([fp["dtype"], fp["idx"], fp["bin"]], sort_keys=True).encode(), digest_size=16).hexdigest()
        return ShardMeta(self.files.name(st), st.size, len(opened), sample, st.etag, st.mtime)
