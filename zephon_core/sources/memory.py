"""In-memory documents: for tests, examples and small generated data."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from zephon_core.errors import DataError
from zephon_core.sources.base import Source


class MemorySource(Source):
    """Documents held in a Python list: strings, dicts or token sequences."""

    def __init__(self, documents: Iterable[Any], name: str = "memory") -> None:
        self._docs = [np.asarray(d, dtype=np.int64) if isinstance(d, (list, tuple, np.ndarray)) else d for d in documents]
        self.name = name
        self._require_nonempty(f"MemorySource {name!r}")

    def __len__(self) -> int:
        return len(self._docs)

    def read(self, indices: Sequence[int]) -> list[Any]:
        return [self._docs[i] for i in indices]

    def token_lengths(self) -> np.ndarray | None:
        if not all(isinstance(d, np.ndarray) for d in self._docs):
            return None
        return np.array([len(d) for d in self._docs], dtype=np.int64)

    def byte_lengths(self) -> np.ndarray | None:
        if not all(isinstance(d, (str, dict)) for d in self._docs):
            return None
        return np.array([len(d.encode("utf-8", "surrogatepass") if isinstance(d, str) else json.dumps(d).encode()) for d in self._docs], dtype=np.int64)

    def fingerprint(self) -> dict[str, Any]:
        h = hashlib.blake2b(digest_size=16)
        for d in self._docs:
            if isinstance(d, np.ndarray):
                h.update(b"t" + d.tobytes())
            elif isinstance(d, str):
                h.update(b"s" + d.encode("utf-8", "surrogatepass"))
            else:
                try:
                    h.update(b"j" + json.dumps(d, sort_keys=True).encode())
                except TypeError as e:
                    raise DataError(f"MemorySource {self.name!r}: documents must be str, dict or token lists ({e})") from None
            h.update(b"\x00")
        return {"kind": "memory", "name": self.name, "documents": len(self._docs), "content_blake2b": h.hexdigest()}
