"""The floors and bounds (project venv): what a plain program does with the same data, no loader around it.

* ``generator``: read, tokenize 64 documents at a time, concat, split, stack (P1's plain-Python bound);
* ``tokenizer_alone``: only the tokenizer on texts already in memory (what bounds any one-thread loader);
* ``numpy_copy``: consecutive windows of the memory-mapped tokens (P2's raw floor);
* ``numpy_shuffled_copy``: the documents of a fixed permutation, one slice each;
* ``numpy_zephon_order_copy``: the documents zephon_core's TokenArraySource pipeline delivers, in its
  order (the restated P2 floor).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from loaders import Loader
from loaders.common import EOS, JsonlDocs, dict_tokens, doc_order, load_tokenizer


def generator(a: dict) -> Iterator[dict]:
    """The plain-Python upper bound: read, tokenize 64 documents at a time, concat, split, stack."""
    import numpy as np

    docs = JsonlDocs(a["jsonl"])
    tok = load_tokenizer(a["tokenizer"])
    L, B = a["seq_len"] + 1, a["batch"]
    need = L * B
    pend_t: list = []
    pend_p: list = []
    have = 0
    epoch = 0
    while True:
        order = doc_order(len(docs), a["seed"], epoch)
        for c in range(0, len(order), 64):
            enc = tok.encode_batch([docs.text(int(i)) for i in order[c : c + 64]], add_special_tokens=False)
            for e in enc:
                ids = np.asarray(e.ids + [EOS], dtype=np.int64)
                pend_t.append(ids)
                pend_p.append(np.arange(len(ids), dtype=np.int64))
                have += len(ids)
            if have >= need:
                t, p = np.concatenate(pend_t), np.concatenate(pend_p)
                k = 0
                while have - k >= need:
                    rows = t[k : k + need].reshape(B, L)
                    pos = p[k : k + need].reshape(B, L)
                    yield {"input_ids": rows[:, :-1], "labels": rows[:, 1:], "positions": pos[:, :-1]}
                    k += need
                pend_t, pend_p, have = [t[k:]], [p[k:]], have - k
        epoch += 1


def tokenizer_alone(a: dict) -> Iterator[dict]:
    """What bounds any loader that tokenizes on one thread: only ``encode_batch_fast``
    on texts already in memory (64 per call, the generator's order), no packing. Its
    "batches" are counts of tokens, one per batch's worth."""
    import numpy as np

    docs = JsonlDocs(a["jsonl"])
    texts = [docs.text(int(i)) for i in doc_order(len(docs), a["seed"], 0)]
    tok = load_tokenizer(a["tokenizer"])
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    need = (a["seq_len"] + 1) * a["batch"]
    shape = np.empty((a["batch"], a["seq_len"]), dtype=np.int64)
    have = 0
    while True:
        for c in range(0, len(texts), 64):
            have += sum(len(e.ids) + 1 for e in encode(texts[c : c + 64], add_special_tokens=False))
            while have >= need:
                have -= need
                yield {"input_ids": shape}


def _copy_in_order(tokens: Any, starts: list[int], ends: list[int], a: dict, dtype: Any) -> Iterator[dict]:
    """Copy the documents ``tokens[starts[j]:ends[j]]``, one slice each and over again, into [B, L+1] int64 rows;
    ``dtype``: the joined slices' (None: the tokens' own, widened per batch)."""
    import numpy as np

    L, B = a["seq_len"] + 1, a["batch"]
    need = L * B
    pend: list = []
    have = j = 0
    while True:
        while have < need:
            s, e = starts[j % len(starts)], ends[j % len(starts)]
            pend.append(tokens[s:e])
            have += e - s
            j += 1
        flat = np.concatenate(pend, dtype=dtype)
        rows = flat[:need].astype(np.int64, copy=False).reshape(B, L)
        pend, have = [flat[need:]], len(flat) - need
        yield {"input_ids": rows[:, :-1], "labels": rows[:, 1:]}


def numpy_shuffled_copy(a: dict) -> Iterator[dict]:
    """The floor for pretokenized data in a shuffled document order: per batch, copy the
    documents of a fixed permutation one slice each into [B, L+1] rows (no positions,
    masks, cursors or provenance)."""
    import numpy as np

    tokens = np.asarray(np.load(a["tokens"], mmap_mode="r"))
    offsets = np.load(a["offsets"])
    order = doc_order(len(offsets) - 1, a["seed"], 0)
    yield from _copy_in_order(tokens, offsets[order].tolist(), offsets[order + 1].tolist(), a, np.int64)


def numpy_zephon_order_copy(a: dict) -> Iterator[dict]:
    """The P2 floor: the documents the zephon_core TokenArraySource pipeline delivers (its chunk
    sequence for lane 0 of C=1), copied one slice each into [B, L+1] rows."""
    import numpy as np

    from zephon_core import StaticMixture, TokenArraySource

    tokens = np.asarray(np.load(a["tokens"], mmap_mode="r"))
    offsets = np.load(a["offsets"])
    src = TokenArraySource(a["tokens"], a["offsets"])
    ws = StaticMixture([src], seed=a["seed"], chunk_size=a.get("chunk_size", 64))
    # The order is computed before the first batch (the warm-up): the floor times the copy alone.
    order = np.concatenate([c.documents for c in ws.chunks(list(range(a.get("chunks", 4000)))) if c is not None])
    yield from _copy_in_order(tokens, offsets[order].tolist(), offsets[order + 1].tolist(), a, None)


def numpy_copy(a: dict) -> Iterator[dict]:
    """The raw floor for pretokenized data: copy consecutive [B, L+1] windows out of the memory-mapped tokens."""
    import numpy as np

    tokens = np.load(a["tokens"], mmap_mode="r")
    L, B = a["seq_len"] + 1, a["batch"]
    need = L * B
    pos = 0
    while True:
        if pos + need > len(tokens):
            pos = 0
        rows = np.array(tokens[pos : pos + need], dtype=np.int64).reshape(B, L)
        pos += need
        yield {"input_ids": rows[:, :-1], "labels": rows[:, 1:]}


LOADERS = tuple(
    Loader(fn.__name__, "project", fn, dict_tokens)
    for fn in (generator, tokenizer_alone, numpy_copy, numpy_shuffled_copy, numpy_zephon_order_copy)
)
