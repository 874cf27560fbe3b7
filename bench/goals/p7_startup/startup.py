"""P7's case: start-up of a 10,000-shard JSONL source, cold (no manifest: every shard indexed) and warm (a
manifest next to the data: one read and one listing), on a local folder and on the loopback S3 server (moto);
run through bench/cases.py (``startup``) by bench/run.py.
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


def case(a: dict) -> None:
    """``python bench/cases.py startup JSON``: one RESULT line."""
    emit({**case_startup(a), "loadavg": os.getloadavg()})
