"""P9: what watching costs: tallies and ``stats()`` against no accounting (the standalone
stats_overhead.py of this package, run through the script slot)."""

from __future__ import annotations

from goal import Script, Target, script_goal, verdict
from harness import Context

TARGETS = {"P9_stats_over_off": 0.98}


def argv(ctx: Context) -> list[str]:
    q = ctx.quick
    return ["--work", str(ctx.work), "--rounds", str(2 if q else 5), "--seconds", str(1.0 if q else 2.0)]


def verdicts(R: dict) -> list[dict]:
    rows = []
    for name, c in R.get("P9", {}).get("cases", {}).items():
        v = c["stats_over_off"]
        goal = f"P9 {name}: tallies + stats() every {R['P9']['log_every']} batches vs no accounting (tokens/CPU-s)"
        rows.append(verdict(goal, Target(">=", TARGETS["P9_stats_over_off"]), v,
                            f"{v:.3f} (every batch: {c['stats_every_batch_over_off']:.3f})"))
    return rows


def section(R: dict, B: dict) -> list[str]:
    x = R.get("P9")
    if not x or "error" in x:
        return []
    L = [f"## P9 what watching costs (bench/goals/p9_watching/stats_overhead.py; tokens per CPU second, median of "
         f"{x['rounds']} rounds)\n",
         f"| pipeline | no accounting | tallies (default) | + stats() every {x['log_every']} batches | "
         "+ stats() every batch |",
         "|---|---|---|---|---|"]
    for name, c in x["cases"].items():
        t = c["tokens_per_cpu_s"]
        L.append(f"| {name} | {t['off'] / 1e6:.2f} M | {t['default'] / 1e6:.2f} M ({c['default_over_off']:.3f}) | "
                 f"{t['stats'] / 1e6:.2f} M ({c['stats_over_off']:.3f}) | "
                 f"{t['stats_every_batch'] / 1e6:.2f} M ({c['stats_every_batch_over_off']:.3f}) |")
    return L + [""]


GOAL = script_goal("P9", "what watching costs: tallies and stats() vs no accounting",
                   Script("bench/goals/p9_watching/stats_overhead.py", argv, timeout=1800), TARGETS, verdicts, section)
