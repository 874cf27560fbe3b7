"""The benchmark corpus: ~20k documents derived deterministically from configs/corpus.

Every document is a seeded re-arrangement of paragraphs of the real English prose in
``configs/corpus/stdlib_docs.jsonl`` (Python standard-library docstrings), so token
statistics are those of the project's tokenizer on real text, not of random bytes.
The same corpus is written in every layout a loader needs:

* ``corpus.jsonl``                 one file (zephon_core ``JsonlSource``, torchdata, Grain, generator)
* ``shards/part-XXXX.jsonl``       the same lines as 8 shards (``zephon`` 0.2.0 reads a folder of shards)
* ``tokens.npy`` + ``offsets.npy`` pretokenized (zephon_core ``TokenArraySource``, raw NumPy baseline)
* ``megatron_text_document.{bin,idx}`` the same tokens through megatron-core's own ``IndexedDatasetBuilder``

Everything lands in a folder keyed by a hash of the inputs and parameters, so a rerun
reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "configs" / "corpus" / "stdlib_docs.jsonl"
TOKENIZER = ROOT / "configs" / "corpus" / "tokenizer.json"
EOS_ID = 1  # <|end_of_text|> in configs/corpus/tokenizer.json
VERSION = 2


def _key(n_docs: int, n_pretok: int, seed: int) -> str:
    h = hashlib.sha256()
    for p in (SOURCE, TOKENIZER, Path(__file__)):
        h.update(p.read_bytes())
    h.update(json.dumps([n_docs, n_pretok, seed, VERSION]).encode())
    return h.hexdigest()[:12]


def _paragraphs() -> list[str]:
    paras: list[str] = []
    with open(SOURCE, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            paras.extend(p.strip() for p in text.split("\n\n") if p.strip())
    return paras


def generate_docs(n_docs: int, seed: int) -> list[str]:
    """Document i: 1 + Geometric(mean ~4) paragraphs drawn with a seeded RNG."""
    paras = _paragraphs()
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        k = 1 + min(int(rng.expovariate(1 / 3.0)), 40)
        docs.append("\n\n".join(paras[rng.randrange(len(paras))] for _ in range(k)))
    return docs


def build(work: Path, n_docs: int = 20000, n_pretok: int = 20000, seed: int = 20261129, log=print) -> dict:
    """Create (once) and describe the corpus folder."""

    out = work / f"corpus-{_key(n_docs, n_pretok, seed)}"
    meta_path = out / "meta.json"
    if meta_path.exists():
        return json.loads(meta_path.read_text())
    tmp = work / f".tmp-corpus-{os.getpid()}"
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    (tmp / "shards").mkdir(parents=True)
    t0 = time.perf_counter()
    docs = generate_docs(n_docs, seed)
    lines = [json.dumps({"id": i, "text": d}, ensure_ascii=False) + "\n" for i, d in enumerate(docs)]
    (tmp / "corpus.jsonl").write_text("".join(lines), encoding="utf-8")
    n_shards = 8
    per = -(-n_docs // n_shards)
    for s in range(n_shards):
        (tmp / "shards" / f"part-{s:04d}.jsonl").write_text("".join(lines[s * per : (s + 1) * per]), encoding="utf-8")
    log(f"corpus: {n_docs} documents, {sum(map(len, docs)) / 1e6:.1f} M characters ({time.perf_counter() - t0:.1f} s)")

    arrays, lengths, tokens = _pretokenize(tmp, docs, n_pretok, log)
    _write_megatron(tmp / "megatron_text_document", arrays)

    meta = {
        "key": out.name,
        "seed": seed,
        "documents": n_docs,
        "characters": int(sum(map(len, docs))),
        "bytes_jsonl": (tmp / "corpus.jsonl").stat().st_size,
        "pretokenized_documents": len(arrays),
        "pretokenized_tokens": int(len(tokens)),
        "mean_tokens_per_document": float(lengths.mean()),
        "chars_per_token": float(sum(map(len, docs[: len(arrays)])) / (len(tokens) - len(arrays))),
    }
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    os.replace(tmp, out)
    return meta


def _pretokenize(tmp: Path, docs: list[str], n_pretok: int, log) -> tuple[list, Any, Any]:
    """Pretokenized copy of the first n_pretok documents (document + EOS, as the pipelines produce):
    tokens.npy + offsets.npy in ``tmp``; returns the per-document arrays, their lengths and all tokens."""
    import numpy as np
    from tokenizers import Tokenizer

    t0 = time.perf_counter()
    tok = Tokenizer.from_file(str(TOKENIZER))
    arrays = []
    step = 512
    n_docs = len(docs)
    for a in range(0, min(n_pretok, n_docs), step):
        for e in tok.encode_batch(docs[a : min(a + step, n_pretok)], add_special_tokens=False):
            arrays.append(np.asarray(e.ids + [EOS_ID], dtype=np.int32))
    lengths = np.array([len(x) for x in arrays], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.concatenate(arrays).astype(np.int32)
    np.save(tmp / "tokens.npy", tokens)
    np.save(tmp / "offsets.npy", offsets)
    log(f"pretokenized {len(arrays)} documents -> {len(tokens) / 1e6:.2f} M tokens ({time.perf_counter() - t0:.1f} s)")
    return arrays, lengths, tokens


def _write_megatron(prefix: Path, arrays: list) -> None:
    """The same documents through megatron-core's own writer."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.int32)
    for x in arrays:
        builder.add_document(torch.from_numpy(x), [len(x)])
    builder.finalize(str(prefix) + ".idx")


def paths(work: Path, meta: dict) -> dict[str, str]:
    d = work / meta["key"]
    return {
        "dir": str(d),
        "jsonl": str(d / "corpus.jsonl"),
        "shards": str(d / "shards"),
        "tokens": str(d / "tokens.npy"),
        "offsets": str(d / "offsets.npy"),
        "megatron": str(d / "megatron_text_document"),
        "tokenizer": str(TOKENIZER),
    }
