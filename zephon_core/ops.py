"""Operator definitions.

Operators are plain, immutable descriptions; ``lane.py`` executes them. The
chain is always: per-document operators (``map``, ``filter``, ``tokenize``) ->
``pack`` -> optional ``shuffle`` of packed rows -> ``batch``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zephon_core.errors import ConfigError

RUNNERS = ("thread", "process")
PACK_MODES = ("concat", "pad")


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a positive integer, got {value!r}")
    return value


def callable_identity(fn: Any) -> str:
    """A stable name for a user function, used in the data fingerprint."""
    ident = getattr(fn, "zephon_identity", None)
    if ident is not None:
        return str(ident)
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qual = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{qual}"


def tokenizer_identity(tok: Any) -> str:
    """Content hash for a ``tokenizers.Tokenizer``; a stable name otherwise."""
    to_str = getattr(tok, "to_str", None)
    if callable(to_str):
        try:
            return "tokenizers:" + hashlib.sha256(to_str().encode()).hexdigest()[:32]
        except Exception:
            pass
    return callable_identity(tok)


@dataclass(frozen=True)
class DocOp:
    """Common fields of the per-document operators."""

    parallelism: int = 1
    runner: str = "thread"

    def __post_init__(self) -> None:
        _positive_int(self.parallelism, f"{self.kind}: parallelism")
        if self.runner not in RUNNERS:
            raise ConfigError(f"{self.kind}: runner must be one of {RUNNERS}, got {self.runner!r}")

    kind = "doc"

    def definition(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class MapOp(DocOp):
    fn: Callable[[Any], Any] = field(default=None, kw_only=True)  # type: ignore[assignment]
    kind = "map"

    def definition(self) -> dict[str, Any]:
        return {"op": "map", "fn": callable_identity(self.fn)}


@dataclass(frozen=True)
class FilterOp(DocOp):
    fn: Callable[[Any], bool] = field(default=None, kw_only=True)  # type: ignore[assignment]
    kind = "filter"

    def definition(self) -> dict[str, Any]:
        return {"op": "filter", "fn": callable_identity(self.fn)}


@dataclass(frozen=True)
class TokenizeOp(DocOp):
    tokenizer: Any = field(default=None, kw_only=True)
    bos_id: int | None = field(default=None, kw_only=True)
    eos_id: int | None = field(default=None, kw_only=True)
    kind = "tokenize"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "_tokenizer_identity", tokenizer_identity(self.tokenizer))

    def definition(self) -> dict[str, Any]:
        return {"op": "tokenize", "tokenizer": self._tokenizer_identity, "bos_id": self.bos_id, "eos_id": self.eos_id}


@dataclass(frozen=True)
class PackOp:
    seq_len: int
    mode: str = "concat"
    pad_id: int = 0
    kind = "pack"

    def __post_init__(self) -> None:
        _positive_int(self.seq_len, "pack: seq_len")
        if self.mode not in PACK_MODES:
            raise ConfigError(f"pack: mode must be one of {PACK_MODES}, got {self.mode!r}")
        if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, int):
            raise ConfigError(f"pack: pad_id must be an integer, got {self.pad_id!r}")

    def definition(self) -> dict[str, Any]:
        return {"op": "pack", "seq_len": self.seq_len, "mode": self.mode, "pad_id": self.pad_id}


@dataclass(frozen=True)
class ShuffleOp:
    window: int
    seed: int = 0
    kind = "shuffle"

    def __post_init__(self) -> None:
        _positive_int(self.window, "shuffle: window")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"shuffle: seed must be an integer, got {self.seed!r}")

    def definition(self) -> dict[str, Any]:
        return {"op": "shuffle", "window": self.window, "seed": self.seed}


@dataclass(frozen=True)
class BatchOp:
    batch_size: int
    drop_last: bool = True
    kind = "batch"

    def __post_init__(self) -> None:
        _positive_int(self.batch_size, "batch: batch_size")

    def definition(self) -> dict[str, Any]:
        return {"op": "batch", "batch_size": self.batch_size, "drop_last": self.drop_last}


Op = MapOp | FilterOp | TokenizeOp | PackOp | ShuffleOp | BatchOp
