"""Steered mixtures: how long a decision takes to reach the lanes, and what deciding costs (docs/mixing.md).

    $ZEPHON_PY bench/goals/p12_mixing/mixing_lag.py [--steps N] [--interval K] [--out FILE.json]

Runs configs/data/curriculum_main.toml (C = 8, one batch per lane a step, prefetch 2) with a schedule
controller that changes the weights at every decision (every ``--interval`` steps), and prints per
decision the step after which it was made, its first chunk, and the steps at which the first lane and
every lane delivered a batch of its stage; then the time ``decide`` took (median, max) against the
time the loop spent on data. Ends with one ``RESULT {json}`` line (bench/goals/p12_mixing reports it: no
target, the lag follows from the chunk size and the interval, not from speed).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from measure import emit  # the Runner (bench/harness.py) puts bench/ on PYTHONPATH

from zephon_core.curriculum.controllers import ScheduleController
from zephon_core.pipeline.mixing import Mixing, MixingLoader
from zephon_core.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[3]

LANES = 8


def measure(steps: int, interval: int) -> dict:
    """Per decision its step, first chunk and lags; ``decide``'s times and the data's time per step."""
    recipe = load_recipe(ROOT / "configs" / "data" / "curriculum_main.toml")
    entries = [(s, {"examples": 1 + (s // interval) % 3, "reference": 2, "prose": 1 + (s // (2 * interval)) % 2})
               for s in range(interval, steps, interval)]
    mixing = Mixing(ScheduleController(entries), interval_steps=interval)
    run = MixingLoader(recipe.build_standalone(prefetch=2), mixing)
    first: dict[int, int] = {}
    every: dict[int, int] = {}
    decided: dict[int, tuple[int, int]] = {}
    lane_stage: dict[int, int] = {}
    costs = []
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        for _ in range(LANES):
            b = next(run)
            lane_stage[b.lane] = b.stage
        for st in set(lane_stage.values()):
            first.setdefault(st, step)
        for st in range(min(lane_stage.values()) + 1):
            every.setdefault(st, step)
        if run.due(step):
            t = time.perf_counter()
            d = run.decide(step)
            costs.append(time.perf_counter() - t)
            if d is not None:
                decided[len(run.journal.decisions) + 1] = (step, d.start_chunk)  # stages 0, 1 are the recipe's
    total = time.perf_counter() - t0
    run.close()
    decisions = [{"stage": st, "step": s, "chunk": g, "first_lane_steps": first[st] - s if st in first else None,
                  "every_lane_steps": every[st] - s if st in every else None} for st, (s, g) in sorted(decided.items())]
    return {"steps": steps, "interval": interval, "lanes": LANES, "decisions": decisions,
            "decide_ms": {"median": statistics.median(costs) * 1e3, "max": max(costs) * 1e3, "calls": len(costs)},
            "data_ms_per_step": (total - sum(costs)) / steps * 1e3}


def summary(decisions: list[dict]) -> dict:
    """The range of each lag over the decisions that every lane reached within the run."""
    reached = [d for d in decisions if d["every_lane_steps"] is not None]
    out = {"decisions": len(decisions), "reached_every_lane": len(reached)}
    for key in ("first_lane_steps", "every_lane_steps"):
        xs = [d[key] for d in reached]
        out[key] = [min(xs), max(xs)] if xs else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--interval", type=int, default=20)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    res = measure(a.steps, a.interval)
    for d in res["decisions"]:
        every = "-" if d["every_lane_steps"] is None else d["every_lane_steps"]
        print(f"stage {d['stage']}: decided after step {d['step']}, chunk {d['chunk']}: first lane after "
              f"{d['first_lane_steps']} steps, every lane after {every} steps")
    c = res["decide_ms"]
    print(f"decide: median {c['median']:.1f} ms, max {c['max']:.1f} ms over {c['calls']} decisions; "
          f"the data of a step: {res['data_ms_per_step']:.1f} ms")
    res["lag"] = summary(res["decisions"])
    emit(res, a.out)


if __name__ == "__main__":
    main()
