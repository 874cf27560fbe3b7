"""zephon_core, this checkout (project venv): the tokenize pipeline (P1, P3) and the pretokenized ones (P2)."""

from __future__ import annotations

import json
from typing import Any

from loaders import Loader, Resume
from loaders.common import EOS, load_tokenizer

IMPORTS = ("numpy", "tokenizers", "zephon_core")


def tokenize_pipeline(a: dict, parallelism: int | None = None, **options: Any) -> Any:
    """JSONL -> tokenize (EOS appended) -> pack seq_len -> batch: P1's pipeline."""
    from zephon_core import JsonlSource, Pipeline, StaticMixture

    tok = load_tokenizer(a["tokenizer"])
    src = JsonlSource(a["jsonl"], cache_dir=a["index_cache"])
    p = (
        Pipeline(StaticMixture([src], seed=a["seed"], chunk_size=a.get("chunk_size", 64)))
        .tokenize(tok, eos_id=EOS, parallelism=parallelism or a.get("parallelism", 1))
        .pack(a["seq_len"])
        .batch(a["batch"])
    )
    return p.options(**options) if options else p


def pretok_pipeline(a: dict, kind: str, **options: Any) -> Any:
    """A pretokenized source (``npy``: TokenArraySource; ``megatron``: MegatronIndexedSource) -> pack -> batch."""
    from zephon_core import MegatronIndexedSource, Pipeline, StaticMixture, TokenArraySource

    src = TokenArraySource(a["tokens"], a["offsets"]) if kind == "npy" else MegatronIndexedSource(a["megatron"])
    mix = StaticMixture([src], seed=a["seed"], chunk_size=a.get("chunk_size", 64))
    p = Pipeline(mix).pack(a["seq_len"]).batch(a["batch"])
    return p.options(**options) if options else p


def tokens_of(b: Any) -> int:
    assert b.input_ids.shape == (8, 512), b.input_ids.shape
    return int(b.input_ids.size)


def close(p: Any, it: Any) -> None:
    p.close()


def _save(p: Any, it: Any) -> Any:
    return json.loads(json.dumps(p.checkpoint()))  # as read back from a checkpoint file


def _restore_first(p: Any, st: Any) -> tuple[Any, Any]:
    p.restore(st)
    return next(iter(p)), iter(p)


RESUME = Resume(save=_save, restore_first=_restore_first, size=lambda st: len(json.dumps(st, separators=(",", ":"))))

LOADERS = (
    Loader("zephon_core", "project", lambda a: tokenize_pipeline(a, a.get("parallelism", 1), **a.get("options", {})),
           tokens_of, IMPORTS, close, RESUME),
    Loader("zephon_core_npy", "project", lambda a: pretok_pipeline(a, "npy"), tokens_of, IMPORTS, close),
    Loader("zephon_core_megatron", "project", lambda a: pretok_pipeline(a, "megatron"), tokens_of, IMPORTS, close),
)
