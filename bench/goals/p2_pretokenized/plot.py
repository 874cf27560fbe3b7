"""P2's figure for docs/img (bench/plot.py draws it in the peers venv, which has matplotlib)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from plot_style import colour, label, save, with_before

KEY = "P2"  # the results.json entry it draws


def plot(R: dict, out: Path) -> str:
    rows = with_before(R, "P2", "tokens_per_s")
    fig, ax = plt.subplots(figsize=(9, 0.4 * len(rows) + 1.4))
    names = [k for k, _ in rows][::-1]
    ax.barh(range(len(names)), [v["tokens_per_s"] / 1e6 for _, v in rows][::-1], color=[colour(n) for n in names])
    ax.set_yticks(range(len(names)), [label(n) for n in names], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("M tokens/s (log scale)")
    ax.set_title("P2 pretokenized pack + batch vs a NumPy copy (pale: before)", fontsize=10)
    return save(fig, R, out / "perf_p2_pretokenized.png", bottom=0.06)
