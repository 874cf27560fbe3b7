"""Steered mixtures: how long a decision takes to reach the lanes, and what deciding costs (docs/mixing.md).

    $ZEPHON_PY bench/mixing_lag.py [--steps N] [--interval K]

Runs configs/data/curriculum_main.toml (C = 8, one batch per lane a step, prefetch 2) with a schedule
controller that changes the weights at every decision (every ``--interval`` steps), and prints per
decision the step after which it was made, its first chunk, and the steps at which the first lane and
every lane delivered a batch of its stage; then the time ``decide`` took (median, max) against the
time the loop spent on data. A hand-run study: no target.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from zephon_core.curriculum.controllers import ScheduleController
from zephon_core.pipeline.mixing import Mixing, MixingLoader
from zephon_core.recipe import load_recipe

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--interval", type=int, default=20)
    a = ap.parse_args()
    recipe = load_recipe(ROOT / "configs" / "data" / "curriculum_main.toml")
    entries = [(s, {"examples": 1 + (s // a.interval) % 3, "reference": 2, "prose": 1 + (s // (2 * a.interval)) % 2})
               for s in range(a.interval, a.steps, a.interval)]
    mixing = Mixing(ScheduleController(entries), interval_steps=a.interval)
    run = MixingLoader(recipe.build_standalone(prefetch=2), mixing)
    first: dict[int, int] = {}
    every: dict[int, int] = {}
    decided: dict[int, tuple[int, int]] = {}
    lane_stage: dict[int, int] = {}
    costs = []
    t0 = time.perf_counter()
    for step in range(1, a.steps + 1):
        for _ in range(8):
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
    for st, (s, g) in sorted(decided.items()):
        print(f"stage {st}: decided after step {s}, chunk {g}: first lane after {first.get(st, 0) - s} steps, "
              f"every lane after {every[st] - s if st in every else '-'} steps")
    data_ms = (total - sum(costs)) / a.steps * 1e3
    print(f"decide: median {statistics.median(costs) * 1e3:.1f} ms, max {max(costs) * 1e3:.1f} ms over "
          f"{len(costs)} decisions; the data of a step: {data_ms:.1f} ms")


if __name__ == "__main__":
    main()
