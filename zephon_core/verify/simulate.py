"""Run a pipeline's data path for whole topologies in one process.

Used by the demo, ``zephon verify-elastic`` and the tests: every
data-parallel group of a topology gets its own ``Pipeline``, each global step
takes ``batches_per_step / dp_degree`` batches from every group, and a phase
ends with every group's checkpoint merged into the state the next phase
restores. What comes out is, per global step, the sorted content digests of
its rows: equal lists mean the step trained on exactly the same samples.

A finite curriculum (``exhausted="stop"``) may end inside a phase: a group
whose data has ended takes no more batches, so the last steps may be short,
and a phase ends once every group's data has. A phase of ``steps=None``
runs to that end (an exactly-once check reads a whole epoch so).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from zephon_core.batch import Batch, Segment
from zephon_core.checkpoint.merge import merge_states
from zephon_core.errors import ConfigError
from zephon_core.pipeline import Pipeline

PipelineFactory = Callable[[int, int], Pipeline]  # (dp_degree, dp_group_id) -> pipeline


@dataclass
class StepRecord:
    """One global step: its rows' content digests (sorted) and their provenance."""

    digests: list[str]
    segments: list[tuple[Segment, ...]] = field(default_factory=list)


@dataclass
class Phase:
    """``steps`` global steps on ``dp_degree`` data-parallel groups; ``steps=None``: until every group's data has
    ended (on an endless curriculum that never comes)."""

    dp_degree: int
    steps: int | None


def run_phase(
    make: PipelineFactory,
    phase: Phase,
    batches_per_step: int,
    state: dict[str, Any] | None,
    on_step: Callable[[Phase], None] | None = None,
    on_batch: Callable[[int, Batch], None] | None = None,
    after_step: Callable[[list[Pipeline]], None] | None = None,
) -> tuple[list[StepRecord], dict[str, Any]]:
    """Run ``phase.steps`` global steps (None: to the end of the data) on ``phase.dp_degree`` groups; returns the
    records and the merged state.

    ``on_batch(dp_group_id, batch)`` sees every batch as its group trains on it (to write an audit log, say);
    ``after_step(pipelines)`` gets every group's pipeline after each global step (a steered mixture decides there).
    """
    G = phase.dp_degree
    if batches_per_step % G:
        raise ConfigError(f"batches_per_step={batches_per_step} is not a multiple of dp_degree={G}: groups would take unequal shares")
    per_group = batches_per_step // G
    pipelines = [make(G, gid) for gid in range(G)]
    try:
        if state is not None:
            for p in pipelines:
                p.restore(state)
        live: dict[int, Iterator[Batch]] = {gid: iter(p) for gid, p in enumerate(pipelines)}
        records = []
        steps: Iterable[int] = itertools.count() if phase.steps is None else range(phase.steps)
        for _ in steps:
            record = _step(live, per_group, on_batch)
            if record is None:
                break
            records.append(record)
            if on_step is not None:
                on_step(phase)
            if after_step is not None:
                after_step(pipelines)
        merged = merge_states([p.checkpoint() for p in pipelines])
        return records, merged
    finally:
        for p in pipelines:
            p.close()


def _step(
    live: dict[int, Iterator[Batch]], per_group: int, on_batch: Callable[[int, Batch], None] | None
) -> StepRecord | None:
    """One global step: up to ``per_group`` batches of every group in ``live`` (a group whose data ends leaves it);
    None when no group had a batch left."""
    rows: list[tuple[str, tuple[Segment, ...]]] = []
    taken = 0
    for gid, it in list(live.items()):
        for _ in range(per_group):
            b = next(it, None)
            if b is None:
                del live[gid]
                break
            taken += 1
            rows.extend(zip(b.row_digests(), b.provenance))
            if on_batch is not None:
                on_batch(gid, b)
    if not taken:
        return None
    rows.sort()
    return StepRecord([d for d, _ in rows], [s for _, s in rows])


def run_schedule(
    make: PipelineFactory,
    phases: Sequence[Phase],
    batches_per_step: int,
    state: dict[str, Any] | None = None,
    on_step: Callable[[Phase], None] | None = None,
) -> list[StepRecord]:
    """Run phases one after another, each resuming from the previous one's checkpoint."""
    records: list[StepRecord] = []
    for phase in phases:
        recs, state = run_phase(make, phase, batches_per_step, state, on_step)
        records.extend(recs)
    return records


def first_mismatch(a: Sequence[StepRecord], b: Sequence[StepRecord], *, provenance: bool = False) -> int | None:
    """The first global step (from 0) whose rows differ (with ``provenance``: or come from other documents), or None."""
    for step, (x, y) in enumerate(zip(a, b)):
        if x.digests != y.digests or (provenance and x.segments != y.segments):
            return step
    if len(a) != len(b):
        return min(len(a), len(b))
    return None
