"""Benchmarks of sources at corpus scale (run through bench/cases.py by bench/run.py).

P7  start-up of a 10,000-shard JSONL source: cold (no manifest: every shard indexed) and warm
    (a manifest next to the data: one read and one listing), on a local folder and on the
    loopback S3 server (moto).
P8  object-store reads: range GETs per 1M tokens (per-document vs block shuffle) and tokens/s
    through a proxy adding 20 ms to every request, against the same shards on local disk.
P2  (floor) a NumPy copy of the same documents in the same order the zephon_core pipeline
    delivers them (its chunk sequence), for the restated P2 ratio.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from measure import emit

ROOT = Path(__file__).resolve().parents[1]
# P8's corpus and block mode: 16 shards of ~5 MB; blocks of 512 documents (~1.2 MB), windows of 4 blocks.
SHARDS, DOCS_PER_SHARD, BLOCK = 16, 2048, 512
PAGE_POOL_MB = (
    24  # 4 lanes x a window of 4 blocks (~5 MB) fit; a tenth of the corpus would not help per-document order much
)
perf = time.perf_counter


def _shards(folder: Path, n_files: int, docs_per: int, text: str = "a short document") -> Path:
    marker = folder / f".complete-{n_files}-{docs_per}"
    if marker.exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for k in range(n_files):
        (folder / f"part-{k:05d}.jsonl").write_text(
            "".join(json.dumps({"text": f"{text} {k}-{j}"}) + "\n" for j in range(docs_per))
        )
    marker.touch()
    return folder


def _upload(ep: Any, folder: Path, prefix: str) -> None:
    fs = ep.filesystem()
    files = sorted(folder.glob("*.jsonl"))
    # s3fs sends each group concurrently on its own event loop (16 threads calling pipe_file
    # grew this process by ~600 KB per object: 24 GB for 10,000 objects on one run).
    for k in range(0, len(files), 256):
        fs.pipe({f"{ep.bucket}/{prefix}/{p.name}": p.read_bytes() for p in files[k : k + 256]})


def _timed_source(path: str, **kw: Any) -> tuple[float, int, int]:
    from zephon_core import JsonlSource

    t0 = perf()
    src = JsonlSource(path, **kw)
    return perf() - t0, len(src.metas), len(src)


def _write_manifest(path: str, storage_options: dict | None) -> float:
    from zephon_core.cli import main

    t0 = perf()
    args = ["index", path, "--no-progress"] + (
        ["--storage-options", json.dumps(storage_options)] if storage_options else []
    )
    assert main(args) == 0
    return perf() - t0


def _request_floor(ep: Any, prefix: str) -> float:
    """The store's own floor for a cold start-up: one listing and one whole-object GET per shard, by a
    bare client (s3fs's concurrent ``cat``, a fresh filesystem: no cache), timed on the same server."""
    fs = ep.filesystem()
    t0 = perf()
    paths = sorted(fs.find(f"{ep.bucket}/{prefix}"))
    for k in range(0, len(paths), 256):  # s3fs's own batching, in groups as _upload sends them
        fs.cat(paths[k : k + 256])
    return perf() - t0


def case_startup(a: dict) -> dict:
    """P7: 10,000 shards, cold and warm, local and S3."""
    from zephon_dev.s3_server import S3Server

    n = a.get("files", 10_000)
    folder = _shards(Path(a["work"]) / f"shards-{n}", n, a.get("docs_per_file", 4))
    out: dict[str, Any] = {"files": n}
    for name in ("zephon-manifest.json",):
        (folder / name).unlink(missing_ok=True)
    shutil.rmtree(folder / ".zephon-index", ignore_errors=True)
    with tempfile.TemporaryDirectory() as cache:
        out["local_cold_s"], files, docs = _timed_source(str(folder), cache_dir=f"{cache}/a", use_manifest=False)
        out["local_index_s"] = _write_manifest(str(folder), None)
        out["local_warm_s"], _, _ = _timed_source(str(folder), cache_dir=f"{cache}/b")
        out["documents"] = docs
        server = S3Server(bucket="zephon-bench", mode="process")
        with server as ep:
            t0 = perf()
            _upload(ep, folder, "p7")
            out["s3_upload_s"] = perf() - t0
            so = ep.storage_options
            # Floor and loader interleaved, the quicker of two each: the loopback server shares the
            # machine's 2 cores, and one slow round must not decide the ratio.
            floors, colds = [], []
            for k in range(2):
                floors.append(_request_floor(ep, "p7"))
                server.reset_stats()
                colds.append(
                    _timed_source(ep.url("p7"), cache_dir=f"{cache}/c{k}", storage_options=so, use_manifest=False)[0]
                )
                served = server.stats()
            out["s3_floor_s"], out["s3_cold_s"], out["s3_cold_rounds_s"] = min(floors), min(colds), colds
            out["s3_cold_requests"] = {k: served.get(k, 0) for k in ("get", "list", "head")}
            out["s3_cold_gets_per_shard"] = served.get("get", 0) / n
            out["s3_cold_over_floor"] = out["s3_cold_s"] / out["s3_floor_s"]
            out["s3_index_s"] = _write_manifest(ep.url("p7"), so)
            out["s3_warm_s"], _, _ = _timed_source(ep.url("p7"), cache_dir=f"{cache}/d", storage_options=so)
    return out


def _pipeline(src: Any, tok: Any, block: int | None, C: int = 4) -> Any:
    from zephon_core import Pipeline, StaticMixture

    ws = StaticMixture([src], seed=11, chunk_size=32, block_size=block, block_window=4)
    return (
        Pipeline(ws)
        .tokenize(tok, eos_id=1)
        .pack(512)
        .batch(8)
        .options(canonical_replicas=C, dp_degree=1, dp_group_id=0)
    )


def _run(p: Any, batches: int) -> tuple[float, int]:
    it = iter(p)
    next(it)  # start-up and the first piece are not throughput
    t0, tokens = perf(), 0
    for _ in range(batches):
        b = next(it)
        tokens += int(b.loss_mask.sum())
    dt = perf() - t0
    p.close()
    return dt, tokens


def case_s3_reads(a: dict) -> dict:
    """P8: range GETs per 1M tokens and tokens/s with 20 ms per request, against local disk."""
    from tokenizers import Tokenizer

    from zephon_core import JsonlSource
    from zephon_dev.s3_proxy import S3Proxy
    from zephon_dev.s3_server import S3Server

    tok = Tokenizer.from_file(a["tokenizer"])
    words = Path(a["jsonl"]).read_text().split()[:2000]
    folder = Path(a["work"]) / f"p8-shards-{SHARDS}x{DOCS_PER_SHARD}"
    if not (folder / ".complete").exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for k in range(SHARDS):  # documents of ~2-3 KB of text (~400-600 tokens)
            lines = [
                json.dumps({"text": " ".join(words[(k * 7 + j * 13 + i) % len(words)] for i in range(300 + j % 150))})
                for j in range(DOCS_PER_SHARD)
            ]
            (folder / f"part-{k:03d}.jsonl").write_text("\n".join(lines) + "\n")
        (folder / ".complete").touch()
    batches = a.get("batches", 60)
    # A page pool well under the corpus (80 MB), as 256 MiB is under any real corpus: otherwise
    # the whole corpus would stay in memory and per-document order would look as cheap as blocks.
    from zephon_core.io import remote

    remote.PAGES.budget_bytes = PAGE_POOL_MB << 20
    out: dict[str, Any] = {"latency_ms": 20, "batches": batches, "page_pool_mb": PAGE_POOL_MB}
    with tempfile.TemporaryDirectory() as cache:
        for mode, block in (("per_document", None), ("blocks", BLOCK)):
            dt, tokens = _run(_pipeline(JsonlSource(str(folder), cache_dir=f"{cache}/l{mode}"), tok, block), batches)
            out[f"local_{mode}_tokens_per_s"] = tokens / dt
        with S3Server(bucket="zephon-bench", mode="process") as ep:
            fs = ep.filesystem()
            for p in sorted(folder.glob("*.jsonl")):
                fs.pipe_file(f"{ep.bucket}/p8/{p.name}", p.read_bytes())
            for mode, block in (("per_document", None), ("blocks", BLOCK)):
                with S3Proxy(ep.endpoint_url, latency_s=0.02) as proxy:
                    so = proxy.endpoint(ep.bucket).storage_options
                    so["skip_instance_cache"] = True
                    p = _pipeline(
                        JsonlSource(ep.url("p8"), cache_dir=f"{cache}/s{mode}", storage_options=so), tok, block
                    )
                    proxy.reset_counts()
                    dt, tokens = _run(p, batches)
                    out[f"s3_{mode}_tokens_per_s"] = tokens / dt
                    out[f"s3_{mode}_gets_per_1m_tokens"] = proxy.counts["GET"] / tokens * 1e6
                    out[f"s3_{mode}_tokens"] = tokens
    for mode in ("per_document", "blocks"):
        out[f"{mode}_s3_over_local"] = out[f"s3_{mode}_tokens_per_s"] / out[f"local_{mode}_tokens_per_s"]
    return out


def main(name: str, a: dict) -> None:
    res = {"startup": case_startup, "s3_reads": case_s3_reads}[name](a)
    res["loadavg"] = os.getloadavg()
    emit(res)
