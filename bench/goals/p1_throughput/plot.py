"""P1's figure for docs/img (bench/plot.py draws it in the peers venv, which has matplotlib)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from plot_style import colour, label, save, with_before

KEY = "P1"  # the results.json entry it draws


def plot(R: dict, out: Path) -> str:
    rows = with_before(R, "P1", "tokens_per_s")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 0.42 * len(rows) + 1.8), sharey=True)
    names = [k for k, _ in rows][::-1]
    vals = [v["tokens_per_s"] / 1e3 for _, v in rows][::-1]
    lo = [v["tokens_per_s"] / 1e3 - v["tokens_per_s_min"] / 1e3 for _, v in rows][::-1]
    hi = [v["tokens_per_s_max"] / 1e3 - v["tokens_per_s"] / 1e3 for _, v in rows][::-1]
    ax1.barh(range(len(names)), vals, xerr=[lo, hi], color=[colour(n) for n in names], capsize=3)
    ax1.set_yticks(range(len(names)), [label(n) for n in names], fontsize=8)
    ax1.set_xlabel("k tokens/s, wall (median; min-max of rounds)")
    ax1.set_title("wall clock", fontsize=10)
    fig.suptitle("P1 tokenize + pack + batch, one rank (pale: zephon_core before the hot-path changes)", fontsize=11)
    cpu = [v["tokens_per_cpu_s"] / 1e3 for _, v in rows][::-1]
    ax2.barh(range(len(names)), cpu, color=[colour(n) for n in names])
    ax2.set_xlabel("k tokens per CPU-s (all threads, workers)")
    ax2.set_title("efficiency (less sensitive to load)", fontsize=10)
    return save(fig, R, out / "perf_p1_throughput.png", bottom=0.03)
