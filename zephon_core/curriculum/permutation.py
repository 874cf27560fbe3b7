"""Stateless, seekable permutations of ``[0, n)``.

A Feistel network over the smallest power-of-four domain that covers ``n``,
with cycle walking to stay inside ``[0, n)``. It needs O(1) memory for any
``n`` and maps any index independently, which is what lets a chunk of the
curriculum be computed from its number alone. The round function is a
splitmix64 finaliser, written with NumPy uint64 arithmetic (wrapping), so the
result does not depend on the NumPy version or on the platform.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import numpy as np

_ROUNDS = 6


def _key(text: str) -> int:
    """The 64-bit key of ``text``: the first 8 bytes of its blake2b digest, little-endian."""
    return struct.unpack("<Q", hashlib.blake2b(text.encode(), digest_size=8).digest())[0]


def derive_key(*parts: object) -> int:
    """A 64-bit key from any printable parts, stable across runs and versions."""
    return _key("\x1f".join(repr(p) for p in parts))


def derive_keys(parts: Sequence[object], lasts: Sequence[object]) -> list[int]:
    """``[derive_key(*parts, x) for x in lasts]``, joining the shared parts once."""
    head = "".join(repr(p) + "\x1f" for p in parts)
    return [_key(head + repr(x)) for x in lasts]


_ROUND_SUFFIX = [repr(r).encode() for r in range(_ROUNDS)]


def round_keys_array(keys: Sequence[int]) -> np.ndarray:
    """``[[derive_key(k, r) for r in range(rounds)] for k in keys]``, the round keys of many permutations, as a
    ``[len(keys), rounds]`` uint64 array: the digests are joined and read as little-endian words at once."""
    b2 = hashlib.blake2b
    prefixes = [repr(int(k)).encode() + b"\x1f" for k in keys]
    raw = b"".join([b2(p + sfx, digest_size=8).digest() for p in prefixes for sfx in _ROUND_SUFFIX])
    return np.frombuffer(raw, dtype="<u8").astype(np.uint64).reshape(len(prefixes), _ROUNDS)


def round_keys(key: int) -> list[int]:
    """``[derive_key(key, r) for r in range(_ROUNDS)]``: a permutation's round keys."""
    return [int(k) for k in round_keys_array([key])[0]]


_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_U64 = (1 << 64) - 1
# Below this many values left to cycle-walk, plain Python integers are cheaper than
# another round of ~60 NumPy calls; both compute the same function.
_SCALAR_WALK = 24


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser; ``x`` is a fresh array and is overwritten."""
    x ^= x >> _S30
    x *= np.uint64(_M1)
    x ^= x >> _S27
    x *= np.uint64(_M2)
    x ^= x >> _S31
    return x


def _mix64_int(x: int) -> int:
    x ^= x >> 30
    x = (x * _M1) & _U64
    x ^= x >> 27
    x = (x * _M2) & _U64
    return x ^ (x >> 31)


def _feistel(x: np.ndarray, half_bits: np.uint64, mask: np.uint64, round_keys: list[np.uint64] | list[np.ndarray]) -> np.ndarray:
    left = x >> half_bits
    right = x & mask
    for rk in round_keys:
        left, right = right, left ^ (_mix64(right ^ rk) & mask)
    return (left << half_bits) | right


def _feistel_by_table(x: np.ndarray, half_bits: np.uint64, mask: np.uint64, tables: list[np.ndarray]) -> np.ndarray:
    """``_feistel`` with each round function read from a table of its values over the half domain
    (``tables[r][v] == _mix64(v ^ round_keys[r]) & mask``): two NumPy calls a round instead of eleven."""
    left = x >> half_bits
    right = x & mask
    for table in tables:
        left, right = right, left ^ table[right]
    return (left << half_bits) | right


def _round_tables(half_bits: np.uint64, mask: np.uint64, round_keys: list[np.uint64]) -> list[np.ndarray]:
    half = np.arange(int(mask) + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return [_mix64(half ^ rk) & mask for rk in round_keys]


def _geometry(n: int) -> tuple[np.uint64, np.uint64]:
    """Half-width in bits and half mask of the smallest power-of-four domain covering ``[0, n)``."""
    half_bits = (max(2, (n - 1).bit_length()) + 1) // 2
    return np.uint64(half_bits), np.uint64((1 << half_bits) - 1)


class IndexPermutation:
    """A bijection of ``[0, n)`` chosen by ``key``.

    ``perm[i]`` and ``perm.take(indices)`` evaluate it; nothing is materialised.
    """

    __slots__ = ("n", "key", "_half_bits", "_mask", "_round_keys", "_int_round_keys", "_tables")

    def __init__(self, n: int, key: int) -> None:
        if n < 1:
            raise ValueError(f"cannot permute an empty range (n={n})")
        self.n = int(n)
        self.key = int(key)
        self._half_bits, self._mask = _geometry(self.n)
        self._round_keys = [np.uint64(k) for k in round_keys(self.key)]
        self._int_round_keys = [int(k) for k in self._round_keys]
        self._tables: list[np.ndarray] | None = None

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        # A table of each round function over the half domain costs as much as computing it for
        # that many values, and makes every later value about five times cheaper.
        if self._tables is None and x.size >= int(self._mask) + 1:
            self._tables = _round_tables(self._half_bits, self._mask, self._round_keys)
        if self._tables is not None:
            return _feistel_by_table(x, self._half_bits, self._mask, self._tables)
        return _feistel(x, self._half_bits, self._mask, self._round_keys)

    def take(self, indices: np.ndarray | list[int]) -> np.ndarray:
        """Map many indices at once; returns int64."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n):
            raise IndexError(f"index out of range for a permutation of {self.n}")
        if self.n == 1:
            return np.zeros_like(idx)
        with np.errstate(over="ignore"):
            x = idx.astype(np.uint64)
            out = self._encrypt(x)
            todo = np.flatnonzero(out >= np.uint64(self.n))
            # Cycle walking: re-encrypt values that fell outside [0, n). The
            # domain is < 4n, so this ends after a few rounds on average.
            while todo.size > _SCALAR_WALK:
                out[todo] = self._encrypt(out[todo])
                todo = todo[out[todo] >= np.uint64(self.n)]
        for j in todo.tolist():
            out[j] = self._walk_int(int(out[j]))
        return out.astype(np.int64)

    def _walk_int(self, x: int) -> int:
        """Cycle-walk one value with Python integers (the same rounds as ``_encrypt``)."""
        half, mask = int(self._half_bits), int(self._mask)
        while True:
            left, right = x >> half, x & mask
            for rk in self._int_round_keys:
                left, right = right, left ^ (_mix64_int(right ^ rk) & mask)
            x = (left << half) | right
            if x < self.n:
                return x

    def __getitem__(self, i: int) -> int:
        return int(self.take(np.array([i]))[0])

    def __len__(self) -> int:
        return self.n


def _rows_feistel(x: np.ndarray, rows: np.ndarray, bounds: np.ndarray, n: int, keys: Sequence[int]) -> np.ndarray:
    """Element ``i`` of ``x`` mapped by the permutation of ``[0, bounds[i])`` keyed ``keys[rows[i]]``, in the domain of ``n``."""
    half_bits, mask = _geometry(n)
    per_row = round_keys_array(keys)
    with np.errstate(over="ignore"):
        out = _feistel(x.astype(np.uint64), half_bits, mask, list(per_row[rows].T))
        todo = np.flatnonzero(out >= bounds)
        while todo.size:  # cycle walking, as in IndexPermutation.take
            out[todo] = _feistel(out[todo], half_bits, mask, list(per_row[rows[todo]].T))
            todo = todo[out[todo] >= bounds[todo]]
    return out.astype(np.int64)


def feistel_domain(n: int) -> int:
    """The Feistel half-width of a permutation of ``[0, n)``: sizes that share it can be permuted together."""
    return int(_geometry(n)[0])


def permute_ragged(sizes: Sequence[int] | np.ndarray, keys: Sequence[int]) -> np.ndarray:
    """``IndexPermutation(sizes[j], keys[j]).take(arange(sizes[j]))`` for every ``j``, end to end, in one set of NumPy calls.

    The sizes (each >= 2) must share one ``feistel_domain``: chunks of
    token-weighted stages differ in size, and are interleaved together.
    """
    n = np.asarray(sizes, dtype=np.int64)
    if not len(n):
        return np.zeros(0, dtype=np.int64)
    if n.min() < 2 or len({feistel_domain(int(x)) for x in set(n.tolist())}) != 1:
        raise ValueError(f"permute_ragged needs sizes >= 2 of one Feistel domain, got {sorted(set(n.tolist()))}")
    rows = np.repeat(np.arange(len(n)), n)
    x = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    return _rows_feistel(x, rows, n.astype(np.uint64)[rows], int(n.max()), keys)
