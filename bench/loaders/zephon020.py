"""zephon 0.2.0 from PyPI (peers venv): Dataset.from_path -> decode_text -> map_transform(encode) -> pack_flat
-> batch."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

from loaders import Loader, Resume
from loaders.common import EOS, load_tokenizer


def pipeline(a: dict) -> Any:
    from zephon import Pipeline
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    tok = load_tokenizer(a["tokenizer"])

    def encode(payload: dict) -> dict:
        return {"input_ids": tok.encode(payload["text"], add_special_tokens=False).ids + [EOS]}

    ds = Dataset.from_path("corpus", a["shards"])
    ws = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"corpus": 1.0}), seed=a["seed"])
    return (
        Pipeline(ws)
        .decode_text()
        .map_transform(encode, parallelism=a.get("parallelism"))
        .pack_flat(a["seq_len"] + 1, algorithm="wrap", tokens_field="input_ids")
        .batch(a["batch"])
    )


def tokens_of(b: Any) -> int:
    t = b.to_training(return_labels=True)
    x = t["input_ids"]
    assert tuple(x.shape) == (8, 512), x.shape
    return int(x.size)


def _restore_first(p: Any, st: Any) -> tuple[Any, Any]:
    p.restore(copy.deepcopy(st))
    it = iter(p)
    return next(it), it


def _size(st: Any) -> int:
    try:
        return len(json.dumps(st, separators=(",", ":")))
    except TypeError:
        return len(pickle.dumps(st))


RESUME = Resume(save=lambda p, it: copy.deepcopy(p.checkpoint()), restore_first=_restore_first, size=_size)

LOADERS = (
    Loader("zephon020", "peers", pipeline, tokens_of, ("numpy", "tokenizers", "zephon"),
           lambda p, it: getattr(p, "close", lambda: None)(), RESUME),
)
