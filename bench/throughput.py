"""Throughput of one loader (P1, P2): the ``throughput`` case, and the rounds the driver runs it in."""

from __future__ import annotations

from typing import Any

import loaders
from harness import Runner, log, med
from measure import finish, rss_mb, run_throughput

Case = tuple[str, str, dict]  # (row label, venv, the case's arguments)
SUMMARY = ("batches_per_s", "tokens_per_s", "tokens_per_cpu_s", "ttfb_s", "rss_beyond_mb", "rss_base_mb",
           "children_rss_mb", "cpu_s_per_s", "children_cpu_s_per_s")


def case_throughput(a: dict) -> None:
    """``python bench/cases.py throughput JSON``: time to first batch, then steady batches/s and tokens/s of
    ``a["loader"]`` (bench/loaders), its CPU time and its peak memory beyond its libraries'."""
    loader = loaders.get(a["loader"])
    loader.import_libraries()
    base = rss_mb()
    obj = loader.make(a)
    res = run_throughput(lambda: iter(obj), loader.tokens_of, a)
    it = res["_it"]
    finish(res, base, lambda: loader.close(obj, it))


def case(label: str, args: dict, loader: str, **kw: Any) -> Case:
    """One row of a throughput table: ``loader`` (its venv from bench/loaders) with ``args`` and ``kw``."""
    return label, loaders.get(loader).venv, {**args, "loader": loader, **kw}


def _summary(name: str, venv: str, args: dict, runs: list[dict]) -> dict:
    ok = [x for x in runs if "error" not in x]
    config = {k: v for k, v in args.items() if k in ("loader", "parallelism", "num_workers", "options")}
    row: dict[str, Any] = {"venv": venv, "config": config, "runs": runs}
    if not ok:
        row["error"] = runs[-1].get("error")
        return row
    for key in SUMMARY:
        row[key] = med([x.get(key) for x in ok])
    row["tokens_per_s_min"] = min(x["tokens_per_s"] for x in ok)
    row["tokens_per_s_max"] = max(x["tokens_per_s"] for x in ok)
    row["rss_beyond_mb_max"] = max(x["rss_beyond_mb"] for x in ok)
    return row


def run_rounds(r: Runner, cases: list[Case], rounds: int, tag: str) -> dict[str, dict]:
    """Every case once per round, the order rotated each round (load drifts over minutes); medians per row."""
    per: dict[str, list[dict]] = {name: [] for name, _, _ in cases}
    for k in range(rounds):
        order = cases[k % len(cases):] + cases[: k % len(cases)]
        for name, venv, args in order:
            res = r.case(venv, "throughput", args, timeout=180, label=f"{tag} {name}")
            per[name].append(res)
            if "error" not in res:
                log(f"  {tag} round {k + 1} {name:36s} {res['batches_per_s']:9.1f} batches/s  "
                    f"{res['tokens_per_s'] / 1e3:9.1f} k tok/s  {res['tokens_per_cpu_s'] / 1e3:9.1f} k tok/CPU-s  "
                    f"TTFB {res['ttfb_s'] * 1e3:6.0f} ms")
    return {name: _summary(name, venv, args, per[name]) for name, venv, args in cases}
