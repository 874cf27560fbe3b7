"""WebDataset tar shards: zephon_core's ``WebDatasetSource`` beside the ``webdataset`` package on the same documents.

    PYTHONPATH=.:bench python bench/goals/p10_formats/format_webdataset.py [--work DIR] [--quick] [--out FILE.json]

The bench corpus's documents (``bench/corpus.py``: seeded arrangements of real English prose) are written
once by ``webdataset.ShardWriter`` as tar shards (each sample a ``.txt``, a ``.json`` and a ``.cls``
member) and indexed by ``zephon index``. In one process run, the same documents are then read

* by zephon_core: ``WebDatasetSource`` (start-up from the manifest, random-access byte-range reads)
  -> tokenize -> pack 512 -> batch 8, one shuffled epoch (``exhausted="stop"``), the pipeline's default
  execution (one reader thread, no prefetch);
* by ``webdataset.WebDataset(urls, shardshuffle=False)``: streaming iteration, the ``.txt`` member
  decoded, tokenized with the same tokenizer (``encode_batch_fast``, 64 documents a call, as zephon's
  tokenize op) and packed greedily into the same rows of 512 + 1 tokens, batches of 8.

Reported for each: start-up seconds (constructing the loader to its first batch), documents/s,
tokens/s (tokens in delivered rows) and, reading alone (no tokenizer), documents/s and MB/s of text.
Last, the start-up of a 10,000-shard source (``--quick``: 1,000) from its manifest beside webdataset's
time to its first sample over a brace-expanded URL list of the same shards. Prints one ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import corpus
from measure import emit

ROOT = Path(__file__).resolve().parents[3]

SEQ_LEN, BATCH, SEED, TOKENIZE_BATCH = 512, 8, 20261129, 64
VERSION = 1
perf = time.perf_counter


def log(msg: str) -> None:
    print("# " + msg, file=sys.stderr, flush=True)


def write_corpus(work: Path, n_docs: int, per_shard: int) -> Path:
    """The documents as tar shards by webdataset's own writer, once per (documents, shard size); indexed by zephon."""
    import webdataset as wds

    from zephon_core.cli import main

    docs = corpus.generate_docs(n_docs, SEED)
    folder = work / f"wds-{n_docs}-{per_shard}-v{VERSION}"
    done = folder / ".complete"
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        t0 = perf()
        with wds.ShardWriter(str(folder / "shard-%05d.tar"), maxcount=per_shard, verbose=0) as w:
            for i, text in enumerate(docs):
                w.write({"__key__": f"{i:08d}", "txt": text, "json": {"id": i, "chars": len(text)}, "cls": i % 7})
        t1 = perf()
        assert main(["index", str(folder), "--format", "webdataset", "--no-progress"]) == 0
        log(
            f"wrote {n_docs} documents as {len(list(folder.glob('*.tar')))} shards ({t1 - t0:.1f} s), "
            f"zephon index {perf() - t1:.1f} s"
        )
        done.touch()
    return folder


def zephon_epoch(folder: Path, tok: Any, cache: str) -> dict[str, float]:
    """Start-up to the first batch, then the rest of one epoch through tokenize -> pack -> batch."""
    from zephon_core import Pipeline, StaticMixture, WebDatasetSource
    from zephon_core.io.files import Access

    t0 = perf()
    src = WebDatasetSource(str(folder), access=Access(cache_dir=cache))
    opened = perf() - t0
    ws = StaticMixture([src], seed=SEED, chunk_size=64, exhausted="stop")
    p = Pipeline(ws).tokenize(tok, eos_id=corpus.EOS_ID).pack(SEQ_LEN).batch(BATCH)
    it = iter(p)
    first = next(it)
    startup = perf() - t0
    tokens, t1 = first.input_ids.size, perf()
    for b in it:
        tokens += b.input_ids.size
    seconds = perf() - t1
    p.close()
    return {
        "startup_s": startup,
        "source_open_s": opened,
        "documents": len(src),
        "epoch_s": seconds + startup,
        "docs_per_s": len(src) / (seconds + startup),
        "tokens_per_s": tokens / (seconds + startup),
        "tokens": tokens,
    }


def packed_rows(ids: Iterator[list[int]]) -> Iterator[list[int]]:
    """Greedy concatenation into rows of SEQ_LEN + 1 tokens (inputs and the shifted labels), as zephon's concat
    packer."""
    buf: list[int] = []
    for doc in ids:
        buf.extend(doc)
        buf.append(corpus.EOS_ID)
        while len(buf) >= SEQ_LEN + 1:
            yield buf[: SEQ_LEN + 1]
            del buf[: SEQ_LEN + 1]


def webdataset_epoch(urls: list[str], tok: Any) -> dict[str, float]:
    """webdataset's streaming iteration of the same shards, tokenized and packed into the same rows."""
    import numpy as np
    import webdataset as wds

    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def tokenized(samples: Iterator[dict[str, Any]]) -> Iterator[list[int]]:
        texts: list[str] = []
        for s in samples:
            texts.append(s["txt"].decode("utf-8"))
            if len(texts) == TOKENIZE_BATCH:
                yield from (e.ids for e in encode(texts, add_special_tokens=False))
                texts = []
        yield from (e.ids for e in encode(texts, add_special_tokens=False))

    t0 = perf()
    counted: list[int] = [0]

    def counting(samples: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for s in samples:
            counted[0] += 1
            yield s

    rows = packed_rows(tokenized(counting(iter(wds.WebDataset(urls, shardshuffle=False)))))
    tokens, startup, batch = 0, None, []
    for row in rows:
        batch.append(row)
        if len(batch) == BATCH:
            tokens += np.asarray(batch, dtype=np.int64)[:, :-1].size
            batch = []
            startup = perf() - t0 if startup is None else startup
    seconds = perf() - t0
    return {
        "startup_s": float(startup or seconds),
        "documents": counted[0],
        "epoch_s": seconds,
        "docs_per_s": counted[0] / seconds,
        "tokens_per_s": tokens / seconds,
        "tokens": tokens,
    }


def read_only(folder: Path, urls: list[str], cache: str) -> dict[str, dict[str, float]]:
    """Reading the text alone: zephon's random-access reads in chunks of 64, webdataset's stream."""
    import webdataset as wds

    from zephon_core import WebDatasetSource
    from zephon_core.io.files import Access

    src = WebDatasetSource(str(folder), access=Access(cache_dir=cache))
    t0 = perf()
    chars = sum(
        len(d.encode()) for a in range(0, len(src), 64) for d in src.read(list(range(a, min(a + 64, len(src)))))
    )
    z = perf() - t0
    t0 = perf()
    n, size = 0, 0
    for s in wds.WebDataset(urls, shardshuffle=False):
        n, size = n + 1, size + len(s["txt"].decode("utf-8").encode())
    w = perf() - t0
    assert (n, size) == (len(src), chars), "the two loaders read different documents"
    return {
        "zephon": {"docs_per_s": n / z, "mb_per_s": size / z / 1e6},
        "webdataset": {"docs_per_s": n / w, "mb_per_s": size / w / 1e6},
    }


def many_shards(work: Path, n: int, cache: str) -> dict[str, float]:
    """Start-up of an ``n``-shard source from its manifest, beside webdataset's first sample over the same URLs."""
    import webdataset as wds

    from zephon_core import WebDatasetSource
    from zephon_core.cli import main
    from zephon_core.io.files import Access

    folder = work / f"wds-shards-{n}-v{VERSION}"
    done = folder / ".complete"
    index_s = None
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        t0 = perf()
        for k in range(n):
            with wds.TarWriter(str(folder / f"shard-{k:05d}.tar")) as w:
                for j in range(2):
                    w.write({"__key__": f"{k:05d}-{j}", "txt": f"document {j} of shard {k}", "cls": j})
        t1 = perf()
        assert main(["index", str(folder), "--format", "webdataset", "--no-progress"]) == 0
        index_s = perf() - t1
        log(f"wrote {n} shards ({t1 - t0:.1f} s), zephon index {index_s:.1f} s")
        done.touch()
    times = []
    for _ in range(3):
        t0 = perf()
        src = WebDatasetSource(str(folder), access=Access(cache_dir=cache))
        src.read([len(src) - 1])
        times.append(perf() - t0)
    assert len(src) == 2 * n
    pattern = str(folder / f"shard-{{00000..{n - 1:05d}}}.tar")
    theirs = []
    for _ in range(3):
        t0 = perf()
        next(iter(wds.WebDataset(pattern, shardshuffle=False)))
        theirs.append(perf() - t0)
    out = {
        "shards": n,
        "zephon_startup_s": statistics.median(times),
        "webdataset_first_sample_s": statistics.median(theirs),
    }
    return out if index_s is None else {**out, "zephon_index_s": index_s}


def run(work: Path, quick: bool) -> dict[str, Any]:
    from tokenizers import Tokenizer

    n_docs, per_shard, n_many = (2_000, 250, 1_000) if quick else (20_000, 1_250, 10_000)
    work.mkdir(parents=True, exist_ok=True)
    folder = write_corpus(work, n_docs, per_shard)
    urls = sorted(str(p) for p in folder.glob("*.tar"))
    tok = Tokenizer.from_file(str(corpus.TOKENIZER))
    with tempfile.TemporaryDirectory() as cache:  # a cold index cache: start-up reads the manifest
        return _measure(work, folder, urls, tok, cache, n_docs, n_many)


def _measure(
    work: Path, folder: Path, urls: list[str], tok: Any, cache: str, n_docs: int, n_many: int
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "documents": n_docs,
        "shards": len(urls),
        "bytes": sum(Path(u).stat().st_size for u in urls),
        "seq_len": SEQ_LEN,
        "batch": BATCH,
    }
    out["webdataset"] = webdataset_epoch(urls, tok)  # first: it warms the page cache for both
    out["zephon"] = zephon_epoch(folder, tok, cache)
    assert out["zephon"]["documents"] == out["webdataset"]["documents"] == n_docs
    out["read_only"] = read_only(folder, urls, cache)
    out["tokens_per_s_ratio"] = out["zephon"]["tokens_per_s"] / out["webdataset"]["tokens_per_s"]
    out["many_shards"] = many_shards(work, n_many, cache)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(ROOT / "bench" / ".work"))
    ap.add_argument(
        "--quick", action="store_true", help="2,000 documents and 1,000 shards instead of 20,000 and 10,000"
    )
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    res = run(Path(a.work), a.quick)
    for name in ("zephon", "webdataset"):
        r = res[name]
        log(
            f"{name:10s} start-up {r['startup_s']:.3f} s  {r['docs_per_s']:8.0f} docs/s  "
            f"{r['tokens_per_s'] / 1e6:6.2f} M tokens/s  "
            f"read only {res['read_only'][name]['docs_per_s']:8.0f} docs/s "
            f"{res['read_only'][name]['mb_per_s']:6.1f} MB/s"
        )
    m = res["many_shards"]
    log(
        f"{m['shards']} shards: zephon start-up {m['zephon_startup_s']:.3f} s, webdataset first sample "
        f"{m['webdataset_first_sample_s']:.3f} s"
    )
    emit(res, a.out)


if __name__ == "__main__":
    main()
