"""P8 for Megatron .bin/.idx pairs on an object store: Zephon's MegatronIndexedSource vs megatron-core's own S3 reader.

    PYTHONPATH=.:bench python bench/goals/p10_formats/format_megatron_s3.py
        [--work DIR] [--quick] [--prefixes N] [--out FILE.json]

Data: the bench corpus (bench/corpus.py: 20k documents of real prose through the project tokenizer),
each document the tokens of 6 consecutive corpus documents (~1,000 tokens, ~80 MB), as 16 pairs written
by megatron-core's IndexedDatasetBuilder: P8's shape. On moto (zephon_dev/s3_server.py, a child process on
loopback) behind the fault proxy (zephon_dev/s3_proxy.py) adding 20 ms to every request, as P8 does.
Measured in one process:

* GETs per 1M tokens and tokens/s (pack 512, batch 8, 4 lanes, the default execution settings) in
  document order and in block order (blocks of 256 documents, ~1 MB, windows of 4), on the store and
  on local disk; the page pool is cut to 24 MiB (the lanes' windows fit, a third of the corpus does
  not), as P8 does, so the corpus cannot simply stay in memory;
* the peer: megatron-core's IndexedDataset with its ObjectStorageConfig (the .idx downloaded to a
  local cache, the .bin read by boto3 in chunks of ``bin_chunk_nbytes``, here 1 MiB like Zephon's
  pages), reading the same documents in the same chunk order, one sequence at a time as its
  GPTDataset does, for at most ``PEER_SECONDS`` per mode;
* start-up through the 20 ms proxy: cold without a manifest (every pair opened) and with one
  (``zephon index``), and the first batch; against the peer opening every prefix;
* start-up from a manifest of ``--prefixes`` pairs (default 10,000; --quick 1,000): requests and
  seconds, then reads from four of them (each: its .idx once, one range of its .bin); see ``many``.

Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import corpus
from measure import emit

ROOT = Path(__file__).resolve().parents[3]

# P8's shape: 16 pairs of ~5 MB (80 MB), blocks of ~1 MB in windows of 4, 4 lanes, a 24 MB page pool (the windows
# fit, a third of the corpus).
SHARDS, JOIN, BLOCK, WINDOW, LANES, SEQ_LEN, BATCH = 16, 6, 256, 4, 4, 512, 8
LATENCY_S, PAGE_POOL_MB, PEER_CHUNK, PEER_SECONDS, INDEXED = 0.02, 24, 1 << 20, 15.0, 500
perf = time.perf_counter


T0 = perf()


def log(msg: str) -> None:
    print(f"# [{perf() - T0:5.0f} s] {msg}", file=sys.stderr, flush=True)


def split(prefix: str, folder: Path) -> list[str]:
    """The corpus's documents as ``SHARDS`` pairs written by megatron-core, each document ``j`` the tokens of
    corpus documents ``j .. j + JOIN - 1`` (real token statistics, ~1,000 tokens a document, ~80 MB)."""
    out = [str(folder / f"part{k}_text_document") for k in range(SHARDS)]
    if (folder / ".complete").exists():
        return out
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from zephon_core import MegatronIndexedSource

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    src = MegatronIndexedSource(prefix)
    docs, n = src.read(list(range(len(src)))), len(src)
    per = -(-n // SHARDS)
    for k, p in enumerate(out):
        b = IndexedDatasetBuilder(p + ".bin", dtype=np.int32)
        for j in range(k * per, min(n, (k + 1) * per)):
            doc = np.concatenate([docs[(j + i) % n] for i in range(JOIN)]).astype(np.int32)
            b.add_document(torch.from_numpy(doc), [len(doc)])
        b.finalize(p + ".idx")
    (folder / ".complete").touch()
    return out


def upload(ep: Any, files: dict[str, bytes]) -> None:
    fs = ep.filesystem()
    names = sorted(files)
    # s3fs sends a group concurrently: groups of 256 took ~0.2 s an object on moto here (its connection pool
    # is 10 wide), groups of 16 ~5 ms.
    for k in range(0, len(names), 16):
        fs.pipe({f"{ep.bucket}/{n}": files[n] for n in names[k : k + 16]})


@contextmanager
def proxied(ep: Any, latency_s: float = LATENCY_S) -> Any:
    """The proxy in front of ``ep`` and storage options through it (no client retries, no shared instance)."""
    from zephon_dev.s3_proxy import S3Proxy

    with S3Proxy(ep.endpoint_url, latency_s=latency_s) as proxy:
        so = proxy.endpoint(ep.bucket).storage_options
        so["skip_instance_cache"] = True
        yield proxy, so


def pipeline(src: Any, block: int | None, **options: Any) -> Any:
    from zephon_core import Pipeline, StaticMixture

    ws = StaticMixture([src], seed=11, chunk_size=32, block_size=block, block_window=WINDOW)
    return (
        Pipeline(ws).pack(SEQ_LEN).batch(BATCH).options(canonical_replicas=LANES, dp_degree=1, dp_group_id=0, **options)
    )


def run(p: Any, batches: int) -> tuple[float, int]:
    it = iter(p)
    next(it)  # start-up and the first piece are not throughput
    t0, tokens = perf(), 0
    for _ in range(batches):
        tokens += int(next(it).loss_mask.sum())
    dt = perf() - t0
    p.close()
    return dt, tokens


def chunk_order(src: Any, block: int | None, n_docs: int) -> list[int]:
    """The documents of the pipeline's chunks in chunk order (its lanes read the same chunks)."""
    from zephon_core import StaticMixture

    ws = StaticMixture([src], seed=11, chunk_size=32, block_size=block, block_window=WINDOW)
    order: list[int] = []
    g = 0
    while len(order) < n_docs:
        order += [int(d) for c in ws.chunks(list(range(g, g + 64))) if c is not None for d in c.documents]
        g += 64
    return order[:n_docs]


def peer_open(prefixes: list[str], cache: str, remote: bool) -> list[Any]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.object_storage_utils import ObjectStorageConfig

    if not remote:
        return [IndexedDataset(p) for p in prefixes]
    cfg = ObjectStorageConfig(path_to_idx_cache=cache, bin_chunk_nbytes=PEER_CHUNK)
    return [IndexedDataset(p, mmap=False, object_storage_config=cfg) for p in prefixes]


def peer_read(datasets: list[Any], order: list[int], seconds: float) -> tuple[float, int, int]:
    """Documents in ``order`` (global numbers over ``datasets``), one ``get`` per sequence: seconds, tokens,
    documents."""
    import numpy as np

    starts = np.cumsum([0] + [len(d.document_indices) - 1 for d in datasets])
    t0, tokens, n = perf(), 0, 0
    for doc in order:
        f = int(np.searchsorted(starts, doc, side="right") - 1)
        ds, local = datasets[f], doc - int(starts[f])
        for s in range(int(ds.document_indices[local]), int(ds.document_indices[local + 1])):
            tokens += len(ds[s])
        n += 1
        if perf() - t0 > seconds:
            break
    return perf() - t0, tokens, n


def index(url: str, so: dict[str, Any]) -> float:
    from zephon_core.cli import main

    t0 = perf()
    assert main(["index", url, "--format", "megatron", "--no-progress", "--storage-options", json.dumps(so)]) == 0
    return perf() - t0


def reads(ep: Any, local: list[str], batches: int, cache: str) -> dict[str, Any]:
    """Tokens/s and GETs per 1M tokens, Zephon and the peer, document and block order, store vs local disk."""
    from zephon_core import MegatronIndexedSource
    from zephon_core.io.files import Access
    from zephon_dev.s3_server import s3_env

    out: dict[str, Any] = {}
    url = ep.url("p8m")
    for mode, block in (("per_document", None), ("blocks", BLOCK)):
        dt, tokens = run(pipeline(MegatronIndexedSource(local), block), batches)
        out[f"local_{mode}_tokens_per_s"] = tokens / dt
        with proxied(ep) as (proxy, so):
            p = pipeline(
                MegatronIndexedSource(url, storage_options=so, access=Access(cache_dir=f"{cache}/z{mode}")), block
            )
            proxy.reset_counts()
            dt, tokens = run(p, batches)
            out[f"s3_{mode}_tokens_per_s"], out[f"s3_{mode}_gets_per_1m_tokens"] = (
                tokens / dt,
                proxy.counts["GET"] / tokens * 1e6,
            )
        out[f"{mode}_s3_over_local"] = out[f"s3_{mode}_tokens_per_s"] / out[f"local_{mode}_tokens_per_s"]
        order = chunk_order(MegatronIndexedSource(local), block, 20 * batches * BATCH)
        dt, tokens, n = peer_read(peer_open(local, "", False), order, PEER_SECONDS)
        out[f"peer_local_{mode}_tokens_per_s"] = tokens / dt
        with proxied(ep) as (proxy, so):
            saved = dict(os.environ)
            os.environ.update(
                s3_env(proxy.endpoint(ep.bucket))
            )  # boto3 (the peer's client) reads its endpoint from here
            try:
                datasets = peer_open([f"{url}/{Path(p).name}" for p in local], f"{cache}/m{mode}", True)
                proxy.reset_counts()
                dt, tokens, n = peer_read(datasets, order, PEER_SECONDS)
            finally:
                os.environ.clear()
                os.environ.update(saved)
            out[f"peer_s3_{mode}_tokens_per_s"], out[f"peer_s3_{mode}_gets_per_1m_tokens"] = (
                tokens / dt,
                proxy.counts["GET"] / tokens * 1e6,
            )
            out[f"peer_s3_{mode}_documents"] = n
        log(
            f"{mode}: zephon S3 {out[f's3_{mode}_tokens_per_s'] / 1e3:.0f} k tok/s "
            f"({out[f's3_{mode}_gets_per_1m_tokens']:.1f} GETs/1M), "
            f"local {out[f'local_{mode}_tokens_per_s'] / 1e3:.0f} k; "
            f"megatron S3 {out[f'peer_s3_{mode}_tokens_per_s'] / 1e3:.0f} k tok/s "
            f"({out[f'peer_s3_{mode}_gets_per_1m_tokens']:.1f} GETs/1M)"
        )
    return out


def startup(ep: Any, local: list[str], cache: str) -> dict[str, Any]:
    """Cold start-up through the 20 ms proxy: without a manifest, with one, and the peer; each with a fresh node
    cache."""
    from zephon_core import MegatronIndexedSource
    from zephon_core.io.files import Access
    from zephon_dev.s3_server import s3_env

    url, out = ep.url("p8m"), {}
    for name, manifest in (("no_manifest", False), ("manifest", True)):
        with proxied(ep) as (proxy, so):
            t0 = perf()
            src = MegatronIndexedSource(
                url, storage_options=so, access=Access(manifest=manifest, cache_dir=f"{cache}/s{name}")
            )
            out[f"startup_{name}_s"], out[f"startup_{name}_requests"] = perf() - t0, sum(proxy.counts.values())
            it = iter(pipeline(src, BLOCK))
            next(it)
            out[f"first_batch_{name}_s"] = perf() - t0
    with proxied(ep) as (proxy, so):
        saved = dict(os.environ)
        os.environ.update(s3_env(proxy.endpoint(ep.bucket)))
        try:
            t0 = perf()
            peer_open([f"{url}/{Path(p).name}" for p in local], f"{cache}/peer-startup", True)
            out["peer_startup_s"], out["peer_startup_requests"] = perf() - t0, sum(proxy.counts.values())
        finally:
            os.environ.clear()
            os.environ.update(saved)
    return out


def many(ep: Any, n: int, indexed: int, work: Path, cache: str) -> dict[str, Any]:
    """Start-up from the manifest of ``n`` prefixes, and reads from a few of them.

    ``zephon index`` runs (timed: it opens every pair, as a start-up without a manifest does) on
    ``indexed`` pairs of a small dataset; the manifest of the ``n``-pair folder is that one's entry
    under every name (the same bytes: the same size, samples and ETags). Only the pairs read are on
    the store: a start-up from a manifest sends no request for any pair (``manifest_startup_requests``
    says so), and uploading 20,000 objects to moto would take minutes here.
    """
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from zephon_core import MegatronIndexedSource
    from zephon_core.io.files import Access, FileSet
    from zephon_core.sources import manifest

    tiny = str(work / "tiny_text_document")
    b = IndexedDatasetBuilder(tiny + ".bin", dtype=np.int32)
    for d in range(4):
        b.add_document(torch.arange(d * 10, d * 10 + 50, dtype=torch.int64), [50])
    b.finalize(tiny + ".idx")
    pair = {ext: Path(tiny + ext).read_bytes() for ext in (".idx", ".bin")}
    read = sorted({0, n // 3, (2 * n) // 3, n - 1})
    upload(
        ep,
        {
            f"{folder}/p{k:05d}_text_document{ext}": data
            for folder, ks in (("many-head", range(indexed)), ("many", read))
            for k in ks
            for ext, data in pair.items()
        },
    )
    so = ep.storage_options
    out: dict[str, Any] = {"prefixes": n, "indexed_prefixes": indexed, "index_s": index(ep.url("many-head"), so)}
    head = MegatronIndexedSource(ep.url("many-head"), storage_options=so)
    entry = head.metas[0]
    assert len({json.dumps({**m.to_json(), "name": "", "mtime": 0}, sort_keys=True) for m in head.metas}) == 1, (
        "the pairs differ"
    )
    metas = [replace(entry, name=f"p{k:05d}_text_document.idx") for k in range(n)]
    manifest.write_manifest(
        FileSet(ep.filesystem(), f"{ep.bucket}/many", (), True), MegatronIndexedSource.kind, {}, metas
    )
    with proxied(ep) as (proxy, so):
        t0 = perf()
        src = MegatronIndexedSource(ep.url("many"), storage_options=so, access=Access(cache_dir=f"{cache}/many"))
        out["manifest_startup_s"], out["manifest_startup_requests"] = perf() - t0, sum(proxy.counts.values())
        assert len(src) == 4 * n and not src.files.listed
        proxy.reset_counts()
        t0 = perf()
        assert [d.tolist() for d in src.read([4 * k + 3 for k in read])] == [list(range(30, 80))] * len(read)
        out["reads_s_per_prefix"], out["requests_per_prefix_read"] = (
            (perf() - t0) / len(read),
            sum(proxy.counts.values()) / len(read),
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(ROOT / "bench" / ".work"))
    ap.add_argument("--quick", action="store_true", help="250 batches, 1,000 prefixes (200 indexed)")
    ap.add_argument(
        "--prefixes", type=int, default=None, help="pairs of the many-prefix start-up (default 10,000; --quick 1,000)"
    )
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from zephon_core.io import remote
    from zephon_dev.s3_server import S3Server

    work = Path(a.work)
    meta = corpus.build(work, log=log)
    local = split(corpus.paths(work, meta)["megatron"], work / f"megatron-s3-{meta['key']}-{SHARDS}x{JOIN}")
    batches = 250 if a.quick else 1000
    n = a.prefixes or (1000 if a.quick else 10_000)
    remote.PAGES.budget_bytes = PAGE_POOL_MB << 20  # under the corpus (~14 MB), as 256 MiB is under any real one
    res: dict[str, Any] = {
        "latency_ms": LATENCY_S * 1e3,
        "batches": batches,
        "page_pool_mb": PAGE_POOL_MB,
        "prefixes_of_corpus": SHARDS,
        "peer": "megatron.core IndexedDataset + ObjectStorageConfig",
        "peer_bin_chunk_nbytes": PEER_CHUNK,
    }
    with tempfile.TemporaryDirectory() as cache, S3Server(bucket="zephon-bench", mode="process") as ep:
        upload(ep, {f"p8m/{Path(p).name}{ext}": Path(p + ext).read_bytes() for p in local for ext in (".idx", ".bin")})
        res.update(reads(ep, local, batches, cache))
        index(ep.url("p8m"), ep.storage_options)
        res.update(startup(ep, local, cache))
        log(
            f"start-up: no manifest {res['startup_no_manifest_s']:.2f} s, manifest {res['startup_manifest_s']:.2f} s, "
            f"megatron {res['peer_startup_s']:.2f} s"
        )
        res["many"] = many(ep, n, min(n, 200 if a.quick else INDEXED), Path(cache), cache)
        log(
            f"{n} prefixes: manifest start-up {res['many']['manifest_startup_s']:.2f} s in "
            f"{res['many']['manifest_startup_requests']} requests"
        )
    res["loadavg"] = os.getloadavg()
    emit(res, a.out)


if __name__ == "__main__":
    main()
