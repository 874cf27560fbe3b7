"""The style the goals' figures share (bench/goals/<goal>/plot.py): colours, the footer, baseline rows, labels.
Importing it selects matplotlib's file-only backend."""

from __future__ import annotations

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


def save(fig, R: dict, path: Path, bottom: float) -> str:
    """Lay the figure out above a strip of height ``bottom`` for the footer, write it (110 dpi), close it, and
    return the file's name."""
    fig.tight_layout(rect=(0, bottom, 1, 1))
    footer(fig, R)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


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
