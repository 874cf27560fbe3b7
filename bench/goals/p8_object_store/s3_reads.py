"""P8's case: object-store reads, range GETs per 1M tokens (per-document vs block shuffle) and tokens/s through a
proxy adding 20 ms to every request, against the same shards on local disk; run through bench/cases.py
(``s3_reads``) by bench/run.py.
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

# P8's corpus and block mode: 16 shards of ~5 MB; blocks of 512 documents (~1.2 MB), windows of 4 blocks.
SHARDS, DOCS_PER_SHARD, BLOCK = 16, 2048, 512
# 4 lanes x a window of 4 blocks (~5 MB) fit; a tenth of the corpus would not help per-document order much.
PAGE_POOL_MB = 24
perf = time.perf_counter


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


def case(a: dict) -> None:
    """``python bench/cases.py s3_reads JSON``: one RESULT line."""
    emit({**case_s3_reads(a), "loadavg": os.getloadavg()})
