"""Megatron's tokenizer as a Zephon tokenizer, and its identity in the data fingerprint."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any


def _file_digest(path: str) -> str | None:
    h = hashlib.sha256()
    if os.path.isfile(path):
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    if os.path.isdir(path):
        for root, _dirs, files in sorted(os.walk(path)):
            for name in sorted(files):
                p = os.path.join(root, name)
                h.update(os.path.relpath(p, path).encode() + b"\0")
                with open(p, "rb") as f:
                    h.update(f.read())
        return h.hexdigest()
    return None


def megatron_tokenizer_identity(tok: Any) -> str:
    """A content identity for a Megatron tokenizer, recorded in the data fingerprint.

    It uses the tokenizer's ``unique_identifiers`` (what Megatron keys its own
    dataset caches on) with the tokenizer path replaced by a hash of the files
    it names, so moving a tokenizer between a run and its resume is fine but
    changing it is caught.
    """
    ids: dict[str, Any] = {"class": f"{type(tok).__module__}.{type(tok).__qualname__}"}
    try:
        unique = getattr(tok, "unique_identifiers", None)
    except Exception:  # some tokenizers compute it lazily and may fail
        unique = None
    if unique:
        ids.update({str(k): str(v) for k, v in dict(unique).items()})
    path = ids.pop("tokenizer_path", None)
    if path not in (None, "None", ""):
        ids["tokenizer_content"] = _file_digest(str(path)) or str(path)
    return "megatron:" + hashlib.sha256(json.dumps(ids, sort_keys=True).encode()).hexdigest()[:32]


class TokenizerAdapter:
    """Encodes documents the way Megatron's ``preprocess_data.py`` does: ``tokenizer.tokenize(text)``."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.zephon_identity = megatron_tokenizer_identity(tokenizer)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self._tok.tokenize(text)]

    def __reduce__(self) -> Any:  # for runner="process"
        return (TokenizerAdapter, (self._tok,))


def tokenizer_eod(tokenizer: Any) -> int | None:
    for name in ("eod", "eos_id", "eos"):
        try:
            value = getattr(tokenizer, name, None)
        except Exception:
            value = None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None
