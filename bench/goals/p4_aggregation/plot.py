"""P4's figure for docs/img (bench/plot.py draws it in the peers venv, which has matplotlib)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from plot_style import ZC, save

KEY = "P4"  # the results.json entry it draws


def plot(R: dict, out: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    colours = {"local": ZC, "s3": "#2c3e50", "s3rver": "#8e44ad"}
    labels = {"local": "local", "s3": "s3 (moto)", "s3rver": "s3 (s3rver)"}
    B = R.get("baseline") or {}
    for backend, style in (("local", "-o"), ("s3", "-s"), ("s3rver", "-^")):
        pr = R["P4"].get(backend, {}).get("per_ranks", {})
        ns = sorted((int(n) for n, x in pr.items() if "warm_ms" in x))
        if ns:
            ax.plot(
                ns,
                [pr[str(n)]["warm_ms"] for n in ns],
                style,
                label=f"{labels[backend]} (warm)",
                color=colours[backend],
            )
            ax.plot(
                ns,
                [pr[str(n)]["first_round_ms"] for n in ns],
                style,
                alpha=0.35,
                label=f"{labels[backend]} (first round)",
                color=colours[backend],
            )
        pb = B.get("P4", {}).get(backend, {}).get("per_ranks", {})
        nb = sorted((int(n) for n, x in pb.items() if "warm_ms" in x))
        if nb:
            ax.plot(
                nb,
                [pb[str(n)]["warm_ms"] for n in nb],
                ":" + style[-1],
                mfc="none",
                label=f"{labels[backend]} (warm, before {B['commit']})",
                color=colours[backend],
            )
    # The run's own targets (results.json), so the markers cannot drift from the goal module's.
    g8, g64 = R["goals_targets"]["P4_8_ranks_ms"], R["goals_targets"]["P4_64_ranks_ms"]
    ax.plot([8], [g8], "v", color="#c0392b", label=f"goals (8: {g8:g} ms, 64: {g64 / 1000:g} s)")
    ax.plot([64], [g64], "v", color="#c0392b")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks (processes)")
    ax.set_ylabel("aggregation latency, ms (log)")
    ax.set_title("P4 checkpoint aggregation (Aggregator, one process per rank)")
    ax.legend(fontsize=7)
    return save(fig, R, out / "perf_p4_aggregation.png", bottom=0.05)
