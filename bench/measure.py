"""The case process's side: memory and CPU readings, the throughput loop, and the RESULT line (every bench
script's too: ``emit``).

Runs inside ``bench/cases.py`` (either venv): stdlib only at import time; psutil where it is installed.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

perf = time.perf_counter


def emit(res: dict, out: str | None = None) -> None:
    """The result of a case or a bench script: the last ``RESULT`` line of its stdout is what the Runner reads
    back; with ``out`` (a script's ``--out``), the same result indented in that file too."""
    if out:
        Path(out).write_text(json.dumps(res, indent=1))
    print("RESULT " + json.dumps(res), flush=True)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _children(read: Callable[[Any], float]) -> float:
    """The sum of ``read(process)`` over this process's children (worker processes); 0 without psutil."""
    try:
        import psutil
    except ImportError:
        return 0.0
    total = 0.0
    for c in psutil.Process().children(recursive=True):
        try:
            total += read(c)
        except psutil.Error:
            pass
    return total


def children_cpu_s() -> float:
    def cpu(c: Any) -> float:
        t = c.cpu_times()
        return t.user + t.system

    return _children(cpu)


def children_rss_mb() -> float:
    return _children(lambda c: c.memory_info().rss / 2**20)


def _done(a: dict, n: int, el: float) -> bool:
    return ((el >= a.get("min_s", 3.0) and n >= a.get("min_batches", 30)) or n >= a.get("max_batches", 10**6)
            or el >= a.get("max_s", 30.0))


def run_throughput(make: Callable[[], Iterator[Any]], tokens_of: Callable[[Any], int], a: dict) -> dict:
    """Time to first batch, then steady-state batches/s and tokens/s after a warm-up."""
    t0 = perf()
    it = make()
    first = next(it)
    n_tok = tokens_of(first)
    ttfb = perf() - t0
    for _ in range(a.get("warmup", 5)):
        tokens_of(next(it))
    n = toks = 0
    t1 = perf()
    cpu0 = time.process_time()
    ccpu0 = children_cpu_s()
    while True:
        toks += tokens_of(next(it))
        n += 1
        el = perf() - t1
        if _done(a, n, el):
            break
    cpu = time.process_time() - cpu0
    ccpu = children_cpu_s() - ccpu0
    return {
        "batches": n,
        "seconds": el,
        "batches_per_s": n / el,
        "tokens_per_s": toks / el,
        "tokens_per_batch": n_tok,
        "ttfb_s": ttfb,
        "cpu_s_per_s": cpu / el,
        "children_cpu_s_per_s": ccpu / el,
        "tokens_per_cpu_s": toks / max(cpu + ccpu, 1e-9),
        "children_rss_mb": children_rss_mb(),
        "_it": it,
    }


def finish(res: dict, base_rss: float, close: Callable[[], None]) -> None:
    """Memory figures (the peak before anything is closed), close the loader, print the RESULT line."""
    res.pop("_it", None)
    res["rss_base_mb"] = base_rss
    res["rss_peak_mb"] = peak_rss_mb()
    res["rss_beyond_mb"] = res["rss_peak_mb"] - base_rss
    res["loadavg"] = os.getloadavg()
    try:
        close()
    except Exception:
        pass
    emit(res)
