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

import numpy as np

_ROUNDS = 6


def derive_key(*parts: object) -> int:
    """A 64-bit key from any printable parts, stable across runs and versions."""
    text = "\x1f".join(repr(p) for p in parts).encode()
    return struct.unpack("<Q", hashlib.blake2b(text, digest_size=8).digest())[0]


def _mix64(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class IndexPermutation:
    """A bijection of ``[0, n)`` chosen by ``key``.

    ``perm[i]`` and ``perm.take(indices)`` evaluate it; nothing is materialised.
    """

    __slots__ = ("n", "key", "_half_bits", "_mask", "_round_keys")

    def __init__(self, n: int, key: int) -> None:
        if n < 1:
            raise ValueError(f"cannot permute an empty range (n={n})")
        self.n = int(n)
        self.key = int(key)
        bits = max(2, (self.n - 1).bit_length())
        self._half_bits = np.uint64((bits + 1) // 2)
        self._mask = np.uint64((1 << int(self._half_bits)) - 1)
        self._round_keys = [np.uint64(derive_key(self.key, r)) for r in range(_ROUNDS)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left = x >> self._half_bits
        right = x & self._mask
        for rk in self._round_keys:
            left, right = right, left ^ (_mix64(right ^ rk) & self._mask)
        return (left << self._half_bits) | right

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
            todo = out >= np.uint64(self.n)
            # Cycle walking: re-encrypt values that fell outside [0, n). The
            # domain is < 4n, so this ends after a few rounds on average.
            while todo.any():
                out[todo] = self._encrypt(out[todo])
                todo = out >= np.uint64(self.n)
        return out.astype(np.int64)

    def __getitem__(self, i: int) -> int:
        return int(self.take(np.array([i]))[0])

    def __len__(self) -> int:
        return self.n
