"""Issue-level figures for zephon_core on the bundled demo corpus (one process, no peers).

    bash scripts/env.sh >/dev/null; PYTHONPATH=. $(bash scripts/env.sh)/bin/python bench/core_metrics.py

Prints JSON: single-thread tokenize+pack+batch tokens/s, restore-to-first-batch
latency at an early and a late position (and their ratio), and state bytes
per lane. Each figure is the median of several repetitions.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from zephon_core import merge_states
from zephon_core.recipe import load_recipe

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "data" / "demo.toml"


def build(recipe, **opts):
    return recipe.build_standalone(
        dp_degree=1, dp_group_id=0, canonical_replicas=8, prefetch=0, reader_threads=0, **opts
    )


def throughput(recipe, batches: int = 400) -> float:
    p = build(recipe)
    it = iter(p)
    next(it)  # index and first chunk out of the way
    t0 = time.perf_counter()
    tokens = 0
    for _ in range(batches):
        b = next(it)
        tokens += int(b.loss_mask.sum())
    return tokens / (time.perf_counter() - t0)


def restore_latency(recipe, position: int, reps: int = 7) -> tuple[float, int]:
    p = build(recipe)
    it = iter(p)
    for _ in range(position):
        next(it)
    state = p.checkpoint()
    size = len(json.dumps(state["lanes"], separators=(",", ":")))
    times = []
    for _ in range(reps):
        q = build(recipe)
        t0 = time.perf_counter()
        q.restore(state)
        next(iter(q))
        times.append(time.perf_counter() - t0)
        q.close()
    p.close()
    return statistics.median(times) * 1000, size


def main() -> None:
    recipe = load_recipe(RECIPE)
    tps = statistics.median(throughput(recipe) for _ in range(3))
    early_ms, _ = restore_latency(recipe, 16)
    late_ms, lanes_bytes = restore_latency(recipe, 4000)
    merged = merge_states([build(recipe).local_state()])
    print(
        json.dumps(
            {
                "tokens_per_s_single_thread": round(tps),
                "restore_ms_early_batch_16": round(early_ms, 2),
                "restore_ms_late_batch_4000": round(late_ms, 2),
                "restore_late_over_early": round(late_ms / early_ms, 2),
                "state_bytes_per_lane": round(lanes_bytes / 8, 1),
                "whole_state_bytes": len(json.dumps(merged, separators=(",", ":"))),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
