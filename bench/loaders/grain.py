"""Grain (peers venv): MapDataset.source(JSONL).shuffle().repeat().map(encode) -> ConcatThenSplit -> batch."""

from __future__ import annotations

import copy
import json
from typing import Any

from loaders import Loader, Resume
from loaders.common import EOS, JsonlDocs, load_tokenizer


def dataset(a: dict) -> Any:
    import grain
    import grain.experimental as ge
    import numpy as np

    docs = JsonlDocs(a["jsonl"])
    tok = load_tokenizer(a["tokenizer"])

    class Source:
        def __len__(self) -> int:
            return len(docs)

        def __getitem__(self, i: int) -> str:
            return docs.text(int(i))

    def encode(text: str) -> dict:
        return {"tokens": np.asarray(tok.encode(text, add_special_tokens=False).ids + [EOS], dtype=np.int32)}

    ds = grain.MapDataset.source(Source()).shuffle(seed=a["seed"]).repeat().map(encode).to_iter_dataset()
    ds = ge.ConcatThenSplitIterDataset(ds, length_struct={"tokens": a["seq_len"] + 1})
    return ds.batch(a["batch"], drop_remainder=True)


def tokens_of(b: Any) -> int:
    x = b["tokens"][:, :-1]
    assert x.shape == (8, 512), x.shape
    _ = b["tokens"][:, 1:]
    return int(x.size)


def _restore_first(ds: Any, st: Any) -> tuple[Any, Any]:
    it = iter(ds)
    it.set_state(copy.deepcopy(st))
    return next(it), it


RESUME = Resume(save=lambda ds, it: copy.deepcopy(it.get_state()), restore_first=_restore_first,
                size=lambda st: len(json.dumps(st, separators=(",", ":"), default=str)))

LOADERS = (Loader("grain", "peers", dataset, tokens_of, ("grain", "tokenizers"), resume=RESUME),)
