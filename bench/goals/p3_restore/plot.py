"""P3's figure for docs/img (bench/plot.py draws it in the peers venv, which has matplotlib)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from plot_style import ZC, save, with_before

KEY = "P3"  # the results.json entry it draws


def plot(R: dict, out: Path) -> str:
    rows = with_before(R, "P3", "early_ms")
    fig, ax = plt.subplots(figsize=(max(9, 1.1 * len(rows)), 4.0))
    xs = range(len(rows))
    w = 0.38
    before = ["(before" in k for k, _ in rows]
    ax.bar(
        [x - w / 2 for x in xs],
        [v["early_ms"] for _, v in rows],
        w,
        label="early position",
        color="#7fb8b5",
        hatch=["//" if b else "" for b in before],
        edgecolor="white",
    )
    ax.bar(
        [x + w / 2 for x in xs],
        [v["late_ms"] for _, v in rows],
        w,
        label="late position",
        color=ZC,
        hatch=["//" if b else "" for b in before],
        edgecolor="white",
    )
    goal = R["goals_targets"]["P3_ms"]
    ax.axhline(goal, color="#c0392b", lw=1, ls="--", label=f"goal {goal:g} ms")
    ax.set_yscale("log")
    ax.set_xticks(
        list(xs),
        [
            k.replace(" (before", "\n(before").replace(" chunk_size", "\nchunk_size").replace(" (at", "\n(at")
            for k, _ in rows
        ],
        fontsize=7,
    )
    ax.set_ylabel("restore -> first batch, ms (log)")
    ax.set_title("P3 restore -> first batch (median; early = batch ~8, late = batch ~160; hatched: before)")
    ax.legend(fontsize=8)
    return save(fig, R, out / "perf_p3_restore.png", bottom=0.05)
