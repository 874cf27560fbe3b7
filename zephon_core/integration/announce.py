"""What an adapter says about Zephon in a training log: the start-up summary, each rank's lanes, and
where a resumed loader state stood.

Both adapters log the same lines (global rank 0 the summary and the resume, every rank its own lanes
at debug level), so a run's log tells which recipe fed it, on how many lanes, and from which topology
it resumed, whichever framework it ran under. Plain text from plain values: no logging here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zephon_core.checkpoint.state import parse_lanes
from zephon_core.integration.plan import StartupPlan


def startup_line(plan: StartupPlan, framework: str) -> str:
    """One line naming the recipe, the lanes and the topology the plan resolved (after a resume: its lanes)."""
    f, c = plan.facts, plan.coordination
    lanes = plan.canonical_replicas
    per_rank = f"{lanes // f.dp_degree} lane(s) per data-parallel rank" if lanes else "lanes from the resumed state"
    coordination = f", checkpoints merged in {c.aggregate_dir} (run_id {c.run_id})" if f.world_size > 1 else ""
    return (f"zephon: {framework} fed by recipe {plan.recipe.path}: canonical_replicas={lanes if lanes else '?'}, "
            f"data-parallel degree {f.dp_degree}, {per_rank}{coordination}")


def lanes_line(global_rank: int, dp_rank: int, lanes: Sequence[int]) -> str:
    """Which lanes one rank reads, in delivery order."""
    return f"zephon: rank {global_rank} (data-parallel rank {dp_rank}) reads lanes {list(lanes)}"


def skipped_steps_line(at: int, last: int) -> str:
    """The trainer reached skipped global steps at step ``at``, skipped through ``last``: it runs no training for
    them (said once a range; ``at`` is past the range's first step when a run resumes inside it)."""
    steps = f"step {at}" if at == last else f"steps {at}..{last}"
    return (f"zephon: {steps} skipped by the surgery journal: no forward/backward, optimizer or LR-scheduler step "
            "(the lanes moved past their data; the step counter runs on)")


def restored_line(state: Mapping[str, Any], *, dp_degree: int, step: int | None, batches_per_step: int | None) -> str:
    """Where a resumed loader state stood and onto which data-parallel degree it was restored.

    ``step``: the framework's own step of the checkpoint; None: worked out from the batches the lanes delivered
    and ``batches_per_step`` (over all data-parallel ranks), or left out when that is unknown too.
    """
    lanes = parse_lanes(state)
    C = int(state["canonical_replicas"])
    saved_dp = state["topology"].get("dp_degree")
    delivered = sum(lane.delivered for lane in lanes.values())
    if step is None and batches_per_step:
        step = delivered // batches_per_step
    at = f" at step {step}" if step is not None else ""
    return (f"zephon: loader state restored{at} ({delivered} batches delivered over {C} lanes) "
            f"from dp={saved_dp} to dp={dp_degree}")


def surgery_line(where: str, done: str) -> str:
    """One surgery entry a start-up journaled in the loader state (``apply_surgery``'s lines), naming who asked for
    it: the one place a run's log says its data was cut, so the person on call can find it later."""
    return f"zephon: {where}: {done}, journaled in the loader state"
