"""P6: peak memory beyond the interpreter, read off P1's processes (it measures nothing of its own)."""

from __future__ import annotations

from goal import Goal, Target, verdict

TARGETS = {"P6_mb": 50.0}


def verdicts(R: dict) -> list[dict]:
    rows = []
    for name in ("zephon_core p=1", "zephon_core p=2"):
        y = R.get("P1", {}).get(name, {})
        if y.get("rss_beyond_mb") is not None:
            v = y["rss_beyond_mb_max"]
            rows.append(verdict(f"P6 peak RSS beyond the interpreter, {name} (max of runs)",
                                Target("<=", TARGETS["P6_mb"], " MB"), v, f"{v:.1f} MB"))
    return rows


def section(R: dict, B: dict) -> list[str]:
    return []  # P1's table has the column


GOAL = Goal("P6", "memory", TARGETS, verdicts, section, command="bash bench/run.sh --only P1")
