"""P3: restore -> first batch, at an early and a late position, for every loader that checkpoints."""

from __future__ import annotations

import os
import statistics
from typing import Any

import loaders
from goal import Goal, Target, loader_section, verdict
from harness import Context, log
from measure import emit, perf

TARGETS = {"P3_ms": 20.0, "P3_late_over_early": 1.5}
LOADERS = [  # (row label, loader, its arguments)
    ("zephon_core p=1", "zephon_core", {"parallelism": 1}),
    ("zephon_core p=1 chunk_size=16", "zephon_core", {"parallelism": 1, "chunk_size": 16}),
    ("zephon 0.2.0 p=1", "zephon020", {"parallelism": 1}),
    ("torchdata nw=0", "torchdata", {"num_workers": 0}),
    ("torchdata nw=2", "torchdata", {"num_workers": 2}),
    ("grain", "grain", {}),
]


def _states(loader: loaders.Loader, a: dict) -> dict[str, list]:
    """Checkpoints at ``spread`` consecutive batches around each position: a restore's cost depends on
    where in a chunk the cursor stands, so one checkpoint per position would be noisy."""
    assert loader.resume is not None, f"{loader.name} does not checkpoint"
    spread = a.get("spread", 5)
    p = loader.make(a)
    it = iter(p)
    states: dict[str, list] = {"early": [], "late": []}
    done = 0
    for name in ("early", "late"):
        for target in range(a[name] - spread + 1, a[name] + 1):
            while done < target:
                next(it)
                done += 1
            states[name].append(loader.resume.save(p, it))
    loader.close(p, it)
    return states


def case_restore(a: dict) -> None:
    """Reach an early and a late position, checkpoint, then time restore -> first batch on fresh loaders."""
    loader = loaders.get(a["loader"])
    assert loader.resume is not None
    out: dict[str, Any] = {"loader": loader.name, "early_batches": a["early"], "late_batches": a["late"]}
    t0 = perf()
    states = _states(loader, a)
    out["reach_s"] = perf() - t0
    out["state_bytes_early"] = loader.resume.size(states["early"][-1])
    out["state_bytes_late"] = loader.resume.size(states["late"][-1])
    times: dict[str, list[float]] = {"early": [], "late": []}
    build_times: list[float] = []
    for _ in range(a["reps"]):
        for k in range(a.get("spread", 5)):
            for name in ("early", "late"):
                t0 = perf()
                q = loader.make(a)
                t1 = perf()
                _, qit = loader.resume.restore_first(q, states[name][k])
                t2 = perf()
                loader.close(q, qit)
                times[name].append(t2 - t1)
                build_times.append(t1 - t0)
    for name, ts in times.items():
        out[f"{name}_ms"] = statistics.median(ts) * 1e3
        out[f"{name}_p90_ms"] = sorted(ts)[int(0.9 * (len(ts) - 1))] * 1e3
        out[f"{name}_ms_all"] = [t * 1e3 for t in ts]
    out["build_ms"] = statistics.median(build_times) * 1e3
    out["late_over_early"] = out["late_ms"] / out["early_ms"]
    out["loadavg"] = os.getloadavg()
    emit(out)


def run(ctx: Context) -> dict:
    q = ctx.quick
    t = {**ctx.base, "early": 8, "late": 40 if q else 160, "reps": 1 if q else 2, "spread": 3 if q else 5}
    out = {}
    for name, loader, kw in LOADERS:
        res = ctx.runner.case(loaders.get(loader).venv, "restore", {**t, "loader": loader, **kw}, timeout=300,
                              label=f"P3 {name}")
        out[name] = res
        if "error" not in res:
            log(f"  P3 {name:22s} early {res['early_ms']:8.1f} ms  late {res['late_ms']:8.1f} ms  "
                f"late/early {res['late_over_early']:.2f}  state {res['state_bytes_late']} B")
    return out


def verdicts(R: dict) -> list[dict]:
    x = R.get("P3", {}).get("zephon_core p=1", {})
    if "early_ms" not in x:
        return []
    worst = max(x["early_ms"], x["late_ms"])
    v = x["late_over_early"]
    return [verdict("P3 zephon_core restore -> first batch, early / late (median)",
                    Target("<=", TARGETS["P3_ms"], " ms"), worst, f"{x['early_ms']:.1f} / {x['late_ms']:.1f} ms"),
            verdict("P3 zephon_core late/early", Target("<=", TARGETS["P3_late_over_early"]), v, f"{v:.2f}")]


def _floor(R: dict) -> list[str]:
    ceiling = R.get("P1", {}).get("tokenizer alone (texts in memory)", {}).get("tokens_per_s")
    if not ceiling:
        return []
    need = (R["seq_len"] + 1) * R["batch"]
    return [f"Floor for a text pipeline: tokenizing one batch's {need} tokens at the tokenizer-alone rate of P1 "
            f"({ceiling / 1e3:.0f} k tokens/s) takes {need / ceiling * 1e3:.1f} ms, before any reading or packing.\n"]


def _row(name: str, x: dict, B: dict) -> str:
    b = B.get("P3", {}).get(name, {})
    col = (f" {b['early_ms']:.1f} / {b['late_ms']:.1f} |" if "early_ms" in b else " - |") if B else ""
    return (f"| {name} (at batch {x['early_batches']} / {x['late_batches']}) | {x['early_ms']:.1f} "
            f"({x['early_p90_ms']:.0f}) | {x['late_ms']:.1f} ({x['late_p90_ms']:.0f}) | "
            f"{x['late_over_early']:.2f} | "
            f"{x['state_bytes_late']} | {x['build_ms']:.0f} | {x['reach_s']:.1f} |{col}")


_table = loader_section(
    "P3", "## P3 restore -> first batch (median over 5 checkpoints at consecutive batches around each position x "
    "reps; loader already built, its build time beside)\n",
    ["loader", "early ms (p90)", "late ms (p90)", "late/early", "state bytes", "build ms", "time to reach late s"],
    "early / late ms", lambda name, x, part, B: _row(name, x, B))


def section(R: dict, B: dict) -> list[str]:
    return _table(R, B) + _floor(R) if "P3" in R else []


def keep_baseline(part: dict) -> dict:
    return {k: v for k, v in part.items() if k.startswith("zephon_core")}


GOAL = Goal("P3", "restore -> first batch", TARGETS, verdicts, section, run=run, cases={"restore": case_restore},
            keep_baseline=keep_baseline)
