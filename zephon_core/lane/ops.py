"""Operator definitions.

Operators are plain, immutable descriptions; the lane stages execute them. The
chain is always: per-document operators (``map``, ``filter``, ``tokenize``) ->
``pack`` -> optional ``shuffle`` of packed rows -> ``batch``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zephon_core.errors import ConfigError
from zephon_core.validation import require_choice, require_int

RUNNERS = ("thread", "process")
PACK_MODES = ("concat", "pad", "first_fit", "best_fit")
FIT_MODES = ("first_fit", "best_fit")
OVERLONG = ("split", "truncate")
FIT_WINDOW = 1024  # documents per fit window, unless given


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
        # Plain ints: NumPy integers are accepted but must not leak into the JSON definition.
        object.__setattr__(self, "parallelism", require_int(self.parallelism, f"{self.kind}: parallelism", 1))
        require_choice(self.runner, f"{self.kind}: runner", RUNNERS)

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
    _tokenizer_identity: str = field(default="", init=False, repr=False, compare=False)
    kind = "tokenize"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "_tokenizer_identity", tokenizer_identity(self.tokenizer))

    def definition(self) -> dict[str, Any]:
        return {"op": "tokenize", "tokenizer": self._tokenizer_identity, "bos_id": self.bos_id, "eos_id": self.eos_id}


@dataclass(frozen=True)
class PackOp:
    """Rows of ``seq_len + 1`` tokens; ``window``, ``overlong`` are the fit modes' (``zephon_core.lane.fit``).

    ``max_docs_per_row`` (0: no limit) closes a row once it holds that many stretches of documents.
    """

    seq_len: int
    mode: str = "concat"
    pad_id: int = 0
    window: int | None = None  # documents per fit window; FIT_WINDOW for the fit modes when not given
    overlong: str = "split"
    max_docs_per_row: int = 0
    kind = "pack"

    def __post_init__(self) -> None:
        object.__setattr__(self, "seq_len", require_int(self.seq_len, "pack: seq_len", 1))
        require_choice(self.mode, "pack: mode", PACK_MODES)
        object.__setattr__(self, "pad_id", require_int(self.pad_id, "pack: pad_id"))
        require_choice(self.overlong, "pack: overlong", OVERLONG)
        object.__setattr__(self, "max_docs_per_row", require_int(self.max_docs_per_row, "pack: max_docs_per_row", 0))
        fit = self.mode in FIT_MODES
        if not fit and (self.window is not None or self.overlong != "split"):
            given = "window" if self.window is not None else "overlong"
            raise ConfigError(f"pack: {given} is an option of the fit modes ({', '.join(FIT_MODES)}), not of mode={self.mode!r}")
        if fit:
            object.__setattr__(self, "window", require_int(FIT_WINDOW if self.window is None else self.window, "pack: window", 1))

    def definition(self) -> dict[str, Any]:
        """The options at their defaults are left out, so pipelines from before they existed keep their fingerprint."""
        out: dict[str, Any] = {"op": "pack", "seq_len": self.seq_len, "mode": self.mode, "pad_id": self.pad_id}
        if self.window is not None:
            out["window"] = self.window
        if self.overlong != "split":
            out["overlong"] = self.overlong
        if self.max_docs_per_row:
            out["max_docs_per_row"] = self.max_docs_per_row
        return out


@dataclass(frozen=True)
class ShuffleOp:
    window: int
    seed: int = 0
    kind = "shuffle"

    def __post_init__(self) -> None:
        object.__setattr__(self, "window", require_int(self.window, "shuffle: window", 1))
        object.__setattr__(self, "seed", require_int(self.seed, "shuffle: seed"))

    def definition(self) -> dict[str, Any]:
        return {"op": "shuffle", "window": self.window, "seed": self.seed}


@dataclass(frozen=True)
class BatchOp:
    batch_size: int
    drop_last: bool = True
    kind = "batch"

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_size", require_int(self.batch_size, "batch: batch_size", 1))

    def definition(self) -> dict[str, Any]:
        return {"op": "batch", "batch_size": self.batch_size, "drop_last": self.drop_last}


Op = MapOp | FilterOp | TokenizeOp | PackOp | ShuffleOp | BatchOp
