"""Hugging Face datasets' Arrow files: Zephon's ``ArrowSource`` beside ``datasets`` itself, on the same documents.

    PYTHONPATH=.:bench python bench/goals/p10_formats/format_arrow.py
        [--work DIR] [--quick] [--shards N] [--out FILE.json]

The bench corpus's documents (bench/corpus.py: 20k, ``--quick`` 2k) are written once by
``datasets`` (``Dataset.from_dict(...).save_to_disk(..., num_shards=8)``) and read, in one
process, by

* ``zephon``: ``ArrowSource`` on the saved folder: start-up (listing and indexing every shard,
  and from a ``zephon index`` manifest), documents/s and bytes/s of ``read`` in order and in a
  seeded random order (256 documents a call; after a warm-up pass), and tokens/s of a Pipeline
  (tokenize -> pack 512 -> batch 8, the bench tokenizer);
* ``datasets``: ``load_from_disk`` start-up, ``ds[a:b]["text"]`` in order and ``ds[indices]["text"]``
  in the same random order, and tokens/s of the same tokenizer over ``ds.iter(batch_size=256)``
  (tokenizing only: no packing, no batches of token rows).

Then start-up over ``--shards`` (default 10,000; ``--quick`` 1,000) small shards that
``save_to_disk`` wrote: Zephon with a manifest (opens no shard), Zephon without one (indexes every
shard) and ``load_from_disk`` (opens every shard). Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import corpus
from measure import emit

ROOT = Path(__file__).resolve().parents[3]

SEQ_LEN, BATCH, CHUNK, SEED = 512, 8, 256, 7


def log(msg: str) -> None:
    print("# " + msg, file=sys.stderr, flush=True)


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def saved(folder: Path, docs: list[str], shards: int) -> Path:
    """The documents as ``save_to_disk`` writes them (once: a rerun reuses the folder)."""
    import datasets

    if not (folder / "state.json").exists():
        datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(folder), num_shards=shards)
    return folder


def reads(read: Any, n: int, order: list[int], min_s: float) -> dict[str, float]:
    """Documents/s and bytes/s of ``read(indices)`` over every document in ``order``, ``CHUNK`` at a time:
    one pass to warm up (files opened, pages mapped), then passes for at least ``min_s``."""

    def one_pass() -> int:
        return sum(sum(len(t.encode()) for t in read(order[a : a + CHUNK])) for a in range(0, n, CHUNK))

    one_pass()
    passes, size, t0 = 0, 0, time.perf_counter()
    while passes == 0 or time.perf_counter() - t0 < min_s:
        size += one_pass()
        passes += 1
    s = time.perf_counter() - t0
    return {"docs_per_s": passes * n / s, "mb_per_s": size / s / 1e6, "passes": passes}


def zephon_side(folder: Path, tok: Any, seconds: float) -> dict[str, Any]:
    import numpy as np

    from zephon_core import ArrowSource, Pipeline, StaticMixture
    from zephon_core.cli import main

    out: dict[str, Any] = {}
    out["startup_s"], src = timed(lambda: ArrowSource(str(folder), use_manifest=False))
    n = len(src)
    assert main(["index", str(folder), "--format", "arrow", "--no-progress"]) == 0
    out["startup_manifest_s"], _ = timed(lambda: ArrowSource(str(folder)))
    seq = list(range(n))
    rnd = np.random.default_rng(SEED).permutation(n).tolist()
    out["sequential"] = reads(ArrowSource(str(folder)).read, n, seq, seconds / 4)
    out["random"] = reads(ArrowSource(str(folder)).read, n, rnd, seconds / 4)
    p = Pipeline(StaticMixture([ArrowSource(str(folder))], seed=SEED, chunk_size=64)).tokenize(
        tok, eos_id=corpus.EOS_ID
    )
    it = iter(p.pack(SEQ_LEN).batch(BATCH))
    next(it)
    rows, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        next(it)
        rows += BATCH
    out["pipeline_tokens_per_s"] = rows * SEQ_LEN / (time.perf_counter() - t0)
    return out


def datasets_side(folder: Path, tok: Any, seconds: float) -> dict[str, Any]:
    import datasets
    import numpy as np

    out: dict[str, Any] = {}
    out["startup_s"], ds = timed(lambda: datasets.load_from_disk(str(folder)))
    n = len(ds)
    seq = list(range(n))
    rnd = np.random.default_rng(SEED).permutation(n).tolist()
    out["sequential"] = reads(lambda idx: ds[idx[0] : idx[-1] + 1]["text"], n, seq, seconds / 4)
    out["random"] = reads(lambda idx: ds[idx]["text"], n, rnd, seconds / 4)
    tokens, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for batch in ds.iter(batch_size=CHUNK):
            tokens += sum(len(e.ids) + 1 for e in tok.encode_batch(batch["text"]))  # +1: the eos Zephon appends
            if time.perf_counter() - t0 >= seconds:
                break
    out["tokenize_tokens_per_s"] = tokens / (time.perf_counter() - t0)
    return out


def many_shards(work: Path, shards: int) -> dict[str, Any]:
    """Start-up over ``shards`` small shards: with a manifest, without, and ``load_from_disk``."""
    import datasets

    from zephon_core import ArrowSource
    from zephon_core.cli import main

    folder = work / f"arrow-{shards}-shards"
    if not (folder / "state.json").exists():
        t, _ = timed(
            lambda: saved(folder, [f"shard document {i}: " + "x" * (i % 50) for i in range(2 * shards)], shards)
        )
        log(f"save_to_disk wrote {shards} shards in {t:.1f}s")
    out: dict[str, Any] = {"shards": shards}
    out["zephon_index_s"], _ = timed(lambda: main(["index", str(folder), "--format", "arrow", "--no-progress"]))
    out["zephon_manifest_startup_s"], src = timed(lambda: ArrowSource(str(folder)))
    assert len(src.metas) == shards and not src._open, "a manifest start-up opens no shard"
    out["zephon_no_manifest_startup_s"], _ = timed(lambda: ArrowSource(str(folder), use_manifest=False))
    out["datasets_load_from_disk_s"], ds = timed(lambda: datasets.load_from_disk(str(folder)))
    assert len(ds) == len(src)
    return out


def run(work: Path, quick: bool, shards: int | None) -> dict[str, Any]:
    import datasets
    from tokenizers import Tokenizer

    datasets.disable_progress_bars()
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(work / "index-cache"))
    n_docs = 2000 if quick else 20000
    docs = corpus.generate_docs(n_docs, 20261129)
    folder = saved(work / f"arrow-ds-{n_docs}", docs, 8)
    tok = Tokenizer.from_file(str(corpus.TOKENIZER))
    seconds = 1.0 if quick else 4.0
    log(f"{n_docs} documents in 8 shards under {folder}")
    res: dict[str, Any] = {"documents": n_docs, "bytes": sum(len(d.encode()) for d in docs), "quick": quick}
    res["zephon"] = zephon_side(folder, tok, seconds)
    res["datasets"] = datasets_side(folder, tok, seconds)
    res["many_shards"] = many_shards(work, shards or (1000 if quick else 10000))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(ROOT / "bench" / ".work"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--shards", type=int, default=None, help="shards of the start-up case (default 10,000; --quick 1,000)"
    )
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    res = run(work, a.quick, a.shards)
    z, d, m = res["zephon"], res["datasets"], res["many_shards"]
    for name, side in (("zephon", z), ("datasets", d)):
        log(
            f"{name:8s} start-up {side['startup_s']:.3f}s  in order {side['sequential']['docs_per_s']:,.0f} docs/s "
            f"({side['sequential']['mb_per_s']:.0f} MB/s)  random {side['random']['docs_per_s']:,.0f} docs/s"
        )
    log(
        f"zephon start-up from its manifest {z['startup_manifest_s']:.3f}s; tokens/s: zephon pipeline "
        f"{z['pipeline_tokens_per_s']:,.0f}, "
        f"datasets + tokenizer {d['tokenize_tokens_per_s']:,.0f}"
    )
    log(
        f"{m['shards']} shards: zephon with manifest {m['zephon_manifest_startup_s']:.2f}s, without "
        f"{m['zephon_no_manifest_startup_s']:.2f}s, "
        f"load_from_disk {m['datasets_load_from_disk_s']:.2f}s (zephon index {m['zephon_index_s']:.2f}s)"
    )
    emit(res, a.out)


if __name__ == "__main__":
    main()
