"""Shared pipeline definitions for the multi-rank tests (no MPI at import)."""

from __future__ import annotations

import numpy as np

from zephon_core import MemorySource, Pipeline, StaticMixture

C = 8


def documents(n: int = 400, seed: int = 3) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(rng.integers(2, 1000, size=int(rng.integers(3, 60)))) for _ in range(n)]


def work_source() -> StaticMixture:
    return StaticMixture(
        [MemorySource(documents(400, 3), name="web"), MemorySource(documents(150, 4), name="code")],
        [0.75, 0.25],
        seed=11,
        chunk_size=8,
    )


def pipeline(**options) -> Pipeline:
    options.setdefault("canonical_replicas", C)
    return Pipeline(work_source()).pack(seq_len=16).shuffle(window=4, seed=2).batch(2).options(**options)


def reference_steps(steps: int, batches_per_step: int) -> list[list[str]]:
    """Per global step, the sorted row digests of an uninterrupted single-group run."""
    from zephon_core.verify.simulate import Phase, run_schedule

    recs = run_schedule(lambda G, g: pipeline(dp_degree=G, dp_group_id=g, prefetch=0), [Phase(1, steps)], batches_per_step)
    return [r.digests for r in recs]


def take_step_rows(it, n_batches: int) -> list[str]:
    rows: list[str] = []
    for _ in range(n_batches):
        rows.extend(next(it).row_digests())
    return rows
