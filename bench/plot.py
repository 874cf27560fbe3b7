"""Plots of bench/results/results.json: ``python bench/plot.py results.json OUT_DIR`` (needs matplotlib)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ZC = "#0b7a75"
ZC_BEFORE = "#a9d3d0"
PEER = "#9aa5b1"
BASE = "#e0a526"


def colour(name: str) -> str:
    if "(before" in name:
        return ZC_BEFORE
    if name.startswith("zephon_core"):
        return ZC
    if name in ("generator", "NumPy copy"):
        return BASE
    return PEER


def footer(fig, R: dict) -> None:
    m = R["machine"]
    la = m["loadavg_start"]
    fig.text(
        0.01,
        0.005,
        f"{m['nproc']}-CPU shared VM, load avg {la[0]:.1f} at start, {R['loadavg_end'][0]:.1f} at end; "
        f"`{R['command']}`",
        fontsize=7,
        color="#555",
    )


def with_before(R: dict, key: str, field: str) -> list[tuple[str, dict]]:
    """The run's rows, each zephon_core row followed by the baseline's ("before") row, if any."""
    B = R.get("baseline") or {}
    rows = []
    for k, v in R[key].items():
        if field in v:
            rows.append((k, v))
            b = B.get(key, {}).get(k, {})
            if k.startswith("zephon_core") and field in b:
                rows.append((f"{k} (before {B['commit']})", b))
    return rows


def label(name: str) -> str:
    """Short axis labels: a baseline row reads "before <commit>" under its row."""
    if " (before " in name:
        return "  before " + name.rsplit(" (before ", 1)[1].rstrip(")")
    return name.replace(" (prefetch", "\n(prefetch")


def p1(R: dict, out: Path) -> str:
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
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    footer(fig, R)
    p = out / "perf_p1_throughput.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p.name


def p2(R: dict, out: Path) -> str:
    rows = with_before(R, "P2", "tokens_per_s")
    fig, ax = plt.subplots(figsize=(9, 0.4 * len(rows) + 1.4))
    names = [k for k, _ in rows][::-1]
    ax.barh(range(len(names)), [v["tokens_per_s"] / 1e6 for _, v in rows][::-1], color=[colour(n) for n in names])
    ax.set_yticks(range(len(names)), [label(n) for n in names], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("M tokens/s (log scale)")
    ax.set_title("P2 pretokenized pack + batch vs a NumPy copy (pale: before)", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    footer(fig, R)
    p = out / "perf_p2_pretokenized.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p.name


def p3(R: dict, out: Path) -> str:
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
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    footer(fig, R)
    p = out / "perf_p3_restore.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p.name


def p4(R: dict, out: Path) -> str:
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
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    footer(fig, R)
    p = out / "perf_p4_aggregation.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p.name


def main() -> None:
    R = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for key, fn in (("P1", p1), ("P2", p2), ("P3", p3), ("P4", p4)):
        if key in R:
            try:
                print(out / fn(R, out))
            except Exception as e:  # one broken plot must not hide the others
                print(f"{key}: {e!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
