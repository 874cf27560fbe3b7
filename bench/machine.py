"""The run's setting: the machine and package versions, and the corpus every case reads (bench/corpus.py)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from harness import ROOT, Runner, without_timing
from measure import emit

PROJECT_PACKAGES = ["numpy", "tokenizers", "torch", "torchdata", "megatron-core", "fsspec", "s3fs", "moto", "psutil"]
PEERS_PACKAGES = ["zephon", "grain", "numpy", "tokenizers", "matplotlib", "py-spy"]


def case_prepare(a: dict) -> None:
    """Build the corpus (cached) and zephon_core's JSONL index cache."""
    import corpus

    from zephon_core import JsonlSource

    work = Path(a["work"])
    meta = corpus.build(work, n_docs=a["docs"], n_pretok=a["docs"], seed=a["seed"],
                        log=lambda m: print("# " + m, file=sys.stderr, flush=True))
    paths = corpus.paths(work, meta)
    JsonlSource(paths["jsonl"], cache_dir=a["index_cache"])
    emit({"meta": meta, "paths": paths})


def case_versions(a: dict) -> None:
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for name in a["packages"]:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    emit(out)


def _proc(path: str, prefix: str) -> str:
    """The value of the first ``prefix`` line of a /proc file."""
    with open(path) as f:
        for line in f:
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    return ""


def _git() -> tuple[str, bool]:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "zephon_core"], cwd=ROOT, capture_output=True,
                               text=True)
        return commit.stdout.strip(), bool(dirty.stdout.strip())
    except OSError:
        return "?", False


def machine_info(r: Runner) -> dict:
    mem_kb = _proc("/proc/meminfo", "MemTotal").split()
    commit, dirty = _git()
    info = {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "memory": f"{int(mem_kb[0]) / 2**20:.1f} GiB" if mem_kb else "",
        "cpu": _proc("/proc/cpuinfo", "model name"),
        "kernel": platform.release(),
        "git_commit": commit,
        "zephon_core_modified": dirty,
        "loadavg_start": os.getloadavg(),
    }
    info["project_env"] = without_timing(r.case("project", "versions", {"packages": PROJECT_PACKAGES}))
    info["peers_env"] = without_timing(r.case("peers", "versions", {"packages": PEERS_PACKAGES}))
    return info
