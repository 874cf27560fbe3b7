"""Pretokenized documents: NumPy token arrays (memory-mapped, so opening a corpus of any size costs only
its offsets), and the gather every token source packs from (``concat_slices``; Megatron's is ``megatron.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon_core.errors import ConfigError, DataError
from zephon_core.io.fs import content_fingerprint, default_name, is_local, open_fs
from zephon_core.sources.registry import FileSource, SourceArgs, register_format


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
    ``np.memmap`` subclass is several times slower, and ``concat_slices`` slices the raw buffer."""
    return np.frombuffer(a, a.dtype) if isinstance(a, np.memmap) and a.flags.c_contiguous else np.ascontiguousarray(a)


def concat_slices(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, headroom: int = 0) -> np.ndarray:
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


def split_flat(tokens: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
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
        return split_flat(*self.read_flat(np.asarray(indices, dtype=np.int64)))

    def token_lengths(self) -> np.ndarray:
        return np.diff(self._offsets)

    def read_flat(self, indices: np.ndarray, headroom: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The documents at ``indices`` end to end (int64, after ``headroom`` unused slots) and their lengths."""
        indices = np.asarray(indices, dtype=np.int64)
        starts = self._offsets[indices]
        lengths = self._offsets[indices + 1] - starts
        return concat_slices(self._flat, starts, lengths, headroom), lengths

    def fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)

    def _compute_fingerprint(self) -> dict[str, Any]:
        if self._paths is not None:
            parts = [content_fingerprint(*open_fs(p)) for p in self._paths]
        else:
            import hashlib

            parts = [{"blake2b": hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).hexdigest()} for a in (self._tokens, self._offsets)]
        return {"kind": self.kind, "dtype": str(self._tokens.dtype), "tokens": parts[0], "offsets": parts[1]}
