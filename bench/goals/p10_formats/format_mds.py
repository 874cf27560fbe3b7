"""MDS: Zephon's MDS sources through a pipeline beside MosaicML Streaming's own ``StreamingDataset``, same documents.

    PYTHONPATH=.:bench python bench/goals/p10_formats/format_mds.py
        [--work DIR] [--quick] [--compression zstd|none] [--out FILE.json]

The bench corpus's documents (bench/corpus.py: real prose, the project tokenizer) are written
once by ``streaming.MDSWriter`` as one dataset with a ``text`` (``str``) and a ``tokens``
(``ndarray:int32``, the document's ids and EOS) column, in shards of ``SHARD_BYTES``, compressed
as Streaming writes them by default here (zstd). Every reader starts from a fresh copy of that
folder (Streaming decompresses into the folder it reads, Zephon into its shard cache), so each
start-up pays for the first shard's decompression, and they run one after another in one process:

* ``zephon_text``: ``MdsSource`` -> tokenize (the bench tokenizer, EOS) -> pack 512 -> batch 8;
* ``zephon_tokens``: ``MdsTokensSource`` -> pack 512 -> batch 8 (no tokenizer);
* ``streaming_text`` / ``streaming_text_shuffled``: ``StreamingDataset(local=..., shuffle=False/True)``
  iterated in this process, the samples' text batch-encoded (64 at a time) with the same tokenizer
  (Streaming yields documents, it neither tokenizes nor packs: the Zephon rows also pack);
* ``streaming_tokens``: the same dataset iterated, its ``tokens`` column counted.

Each row: start-up seconds (constructing the reader to the first batch or sample) and, over one
epoch, documents/s and tokens/s (wall). Then start-up at ``--shards`` shards (10,000; ``--quick``
1,000): a dataset of one short sample per shard, the time to a source of all of them and its
last document (Zephon reads index.json and one shard) beside ``StreamingDataset``'s construction
and first sample. Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import corpus
import numpy as np
from measure import emit

ROOT = Path(__file__).resolve().parents[3]

SEQ_LEN, BATCH, SEED = 512, 8, 7
SHARD_BYTES = {
    False: 1 << 22,
    True: 1 << 18,
}  # 4 MiB shards (256 KiB --quick; Streaming's default is 64 MiB): a dozen or two


def write_corpus(work: Path, n_docs: int, compression: str | None, shard_bytes: int) -> tuple[Path, int, int]:
    """The bench documents as one MDS dataset (text and tokens columns), once; its folder, documents and tokens."""
    from streaming import MDSWriter
    from tokenizers import Tokenizer

    folder = work / f"mds-{n_docs}-{compression or 'none'}-{shard_bytes}"
    meta = folder / "bench-meta.json"
    if meta.exists():
        m = json.loads(meta.read_text())
        return folder / "data", m["documents"], m["tokens"]
    shutil.rmtree(folder, ignore_errors=True)
    docs = corpus.generate_docs(n_docs, 20261129)
    tok = Tokenizer.from_file(str(corpus.TOKENIZER))
    total = 0
    with MDSWriter(
        out=str(folder / "data"),
        columns={"text": "str", "tokens": "ndarray:int32"},
        compression=compression,
        size_limit=shard_bytes,
        hashes=["xxh64"],
    ) as w:
        for a in range(0, n_docs, 512):
            for text, enc in zip(docs[a : a + 512], tok.encode_batch(docs[a : a + 512], add_special_tokens=False)):
                ids = np.asarray(enc.ids + [corpus.EOS_ID], dtype=np.int32)
                total += len(ids)
                w.write({"text": text, "tokens": ids})
    meta.write_text(json.dumps({"documents": n_docs, "tokens": total}))
    return folder / "data", n_docs, total


def fresh_copy(src: Path, work: Path, name: str) -> Path:
    dst = work / "runs" / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def zephon_row(data: Path, work: Path, name: str, tokens: bool, epoch_tokens: int) -> dict[str, Any]:
    """One epoch through a pipeline; tokens/s counts the epoch's document tokens (EOS included), as Streaming's rows
    do."""
    from tokenizers import Tokenizer

    from zephon_core import MdsSource, MdsTokensSource, Pipeline, StaticMixture

    folder, cache = fresh_copy(data, work, name), work / "runs" / f"{name}-cache"
    shutil.rmtree(cache, ignore_errors=True)
    tok = Tokenizer.from_file(str(corpus.TOKENIZER))
    t0 = time.perf_counter()
    src = (
        MdsTokensSource(str(folder), "tokens", cache_dir=str(cache))
        if tokens
        else MdsSource(str(folder), "text", cache_dir=str(cache))
    )
    ws = StaticMixture([src], seed=SEED, chunk_size=64, exhausted="stop")
    p = Pipeline(ws) if tokens else Pipeline(ws).tokenize(tok, eos_id=corpus.EOS_ID)
    p = p.pack(SEQ_LEN).batch(BATCH, drop_last=False)
    it = iter(p)
    first = next(it)
    startup = time.perf_counter() - t0
    rows = int(first.input_ids.shape[0])
    for b in it:
        rows += int(b.input_ids.shape[0])
    wall = time.perf_counter() - t0
    p.close()
    return {
        "startup_s": startup,
        "epoch_s": wall,
        "documents": len(src),
        "docs_per_s": len(src) / wall,
        "tokens_per_s": epoch_tokens / wall,
        "tokens": epoch_tokens,
        "rows": rows,
        "shards": len(src.metas),
    }


def streaming_row(
    data: Path, work: Path, name: str, count: Callable[[list[dict[str, Any]]], int], shuffle: bool
) -> dict[str, Any]:
    """One epoch of ``StreamingDataset`` in this process; ``count`` takes the samples 64 at a time (the text rows
    batch-encode
    them, as Zephon's tokenize stage does)."""
    from streaming import StreamingDataset

    folder = fresh_copy(data, work, name)
    t0 = time.perf_counter()
    ds = StreamingDataset(local=str(folder), shuffle=shuffle, shuffle_seed=SEED, batch_size=BATCH)
    it = iter(ds)
    n_docs, n_tokens = 1, count([next(it)])
    startup = time.perf_counter() - t0
    group: list[dict[str, Any]] = []
    for sample in it:
        group.append(sample)
        if len(group) == 64:
            n_docs, n_tokens, group = n_docs + len(group), n_tokens + count(group), []
    n_docs, n_tokens = n_docs + len(group), n_tokens + (count(group) if group else 0)
    wall = time.perf_counter() - t0
    return {
        "startup_s": startup,
        "epoch_s": wall,
        "documents": n_docs,
        "docs_per_s": n_docs / wall,
        "tokens_per_s": n_tokens / wall,
        "tokens": n_tokens,
    }


def many_shards(work: Path, shards: int) -> dict[str, Any]:
    """Start-up at ``shards`` shards: Zephon's source (index.json, then the last document) beside StreamingDataset's."""
    from streaming import MDSWriter, StreamingDataset

    from zephon_core import MdsSource

    data = work / f"mds-{shards}-shards" / "data"
    if not (data / "index.json").exists():
        shutil.rmtree(data.parent, ignore_errors=True)
        with MDSWriter(out=str(data), columns={"text": "str"}, size_limit=120) as w:  # one sample per shard
            for d in range(shards):
                w.write({"text": f"document {d} " + "z" * 60})
    folder = fresh_copy(data, work, "zephon-shards")
    t0 = time.perf_counter()
    src = MdsSource(str(folder))
    ready = time.perf_counter() - t0
    last = src.read([len(src) - 1])[0]
    zephon_s = time.perf_counter() - t0
    assert last.startswith(f"document {shards - 1} ")
    folder = fresh_copy(data, work, "streaming-shards")
    t0 = time.perf_counter()
    ds = StreamingDataset(local=str(folder), shuffle=False, batch_size=BATCH)
    built = time.perf_counter() - t0
    assert ds[len(ds) - 1]["text"] == last
    streaming_s = time.perf_counter() - t0
    return {
        "shards": len(src.metas),
        "zephon_source_s": ready,
        "zephon_first_document_s": zephon_s,
        "streaming_dataset_s": built,
        "streaming_first_sample_s": streaming_s,
    }


def run(work: Path, quick: bool, compression: str | None, shards: int) -> dict[str, Any]:
    from tokenizers import Tokenizer

    work.mkdir(parents=True, exist_ok=True)
    n_docs = 2_000 if quick else 20_000
    data, n, total = write_corpus(work, n_docs, compression, SHARD_BYTES[quick])
    tok = Tokenizer.from_file(str(corpus.TOKENIZER))

    def text_tokens(samples: list[dict[str, Any]]) -> int:
        return sum(
            len(e.ids) + 1 for e in tok.encode_batch([s["text"] for s in samples], add_special_tokens=False)
        )  # + EOS, as the pipeline adds

    rows = {
        "zephon_text": zephon_row(data, work, "zephon-text", False, total),
        "streaming_text": streaming_row(data, work, "streaming-text", text_tokens, shuffle=False),
        "streaming_text_shuffled": streaming_row(data, work, "streaming-text-shuffled", text_tokens, shuffle=True),
        "zephon_tokens": zephon_row(data, work, "zephon-tokens", True, total),
        "streaming_tokens": streaming_row(
            data, work, "streaming-tokens", lambda ss: sum(len(s["tokens"]) for s in ss), shuffle=False
        ),
    }
    for name, row in rows.items():
        assert row["documents"] == n and row["tokens"] == total, (name, row, n, total)
    return {
        "documents": n,
        "tokens": total,
        "compression": compression or "none",
        "shard_bytes": SHARD_BYTES[quick],
        "seq_len": SEQ_LEN,
        "batch": BATCH,
        "rows": rows,
        "startup_at_shards": many_shards(work, shards),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(ROOT / "bench" / ".work"))
    ap.add_argument("--quick", action="store_true", help="2,000 documents and 1,000 shards")
    ap.add_argument("--compression", default="zstd", help="as MDSWriter takes it (zstd, zstd:7, gz, ...) or none")
    ap.add_argument(
        "--shards", type=int, default=None, help="the start-up case's shard count (default 10,000; --quick 1,000)"
    )
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    shards = a.shards or (1_000 if a.quick else 10_000)
    res = run(Path(a.work) / "format_mds", a.quick, None if a.compression == "none" else a.compression, shards)
    for name, r in res["rows"].items():
        print(
            f"# {name:24s} start-up {r['startup_s']:6.2f} s  {r['docs_per_s']:9.0f} docs/s  "
            f"{r['tokens_per_s'] / 1e6:6.2f} M tokens/s",
            file=sys.stderr,
        )
    s = res["startup_at_shards"]
    print(
        f"# {s['shards']} shards: zephon source {s['zephon_source_s']:.2f} s (last document "
        f"{s['zephon_first_document_s']:.2f} s), "
        f"StreamingDataset {s['streaming_dataset_s']:.2f} s (last sample {s['streaming_first_sample_s']:.2f} s)",
        file=sys.stderr,
    )
    emit(res, a.out)


if __name__ == "__main__":
    main()
