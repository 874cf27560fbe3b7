"""The schedule of a staged mixture as the lines ``explain()`` prints.

Per stage: its chunks, how its start was given and what it resolved to, and
per source its weight, its share of a chunk and the epochs of it used by the
stage's start and end (or per 1000 chunks, for a last stage that runs on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zephon_core.curriculum.schedule import Schedule, StagePlan
from zephon_core.sources.base import Source

_RUN_ON = 1000


def _start_text(stage: Any, plan: StagePlan, tokens_per_step: int | None) -> str:
    planned = f" (~{plan.tokens_before:.4g} tokens planned)" if plan.tokens_before is not None else ""
    if plan.index == 0:
        return f"starts the run{planned}"
    if stage.start_tokens is not None:
        return f"start_tokens={stage.start_tokens} -> chunk {plan.start_chunk}{planned}"
    if stage.start_step is not None:
        return f"start_step={stage.start_step} x {tokens_per_step} tokens -> chunk {plan.start_chunk}{planned}"
    return f"start_chunk={plan.start_chunk}{planned}"


def _estimate_text(method: dict[str, Any]) -> str:
    if method["method"] == "exact":
        return "exact token counts"
    if method["method"] == "bytes":
        return f"tokens estimated at {method['tokens_per_byte']:g} per stored byte"
    return f"every document counted as {method['tokens']} tokens (sample mean)"


def describe_schedule(schedule: Schedule, stages: Sequence[Any], sources: Sequence[Source], header: str,
                      tokens_per_step: int | None = None) -> list[str]:
    lines = [header]
    for s, src in enumerate(sources):
        estimate = f"; {_estimate_text(schedule.tokens[s].method)}" if schedule.tokens is not None else ""
        lines.append(f"  source {s}: {src.describe()}{estimate}")
    sizes = schedule.sizes
    for i, (stage, plan) in enumerate(zip(stages, schedule.plans)):
        last = i + 1 == len(schedule.plans)
        end = None if last else int(schedule.starts[i + 1])
        span = f"chunks {plan.start_chunk}.." + ("(on)" if end is None else str(end - 1))
        lines.append(f"  stage {i} {plan.name!r}: {span}, weight_by={stage.weight_by}, {_start_text(stage, plan, tokens_per_step)}")
        unit = "tokens" if plan.by_tokens else "documents"
        idle = []
        for s, name in enumerate(schedule.names):
            t = plan.tracks[s]
            at_start = t.start / sizes[s]
            if not t.per_chunk:
                idle.append(f"{name} (stays at {at_start:.3g} epochs)")
                continue
            if end is None:
                later = schedule.position(s, plan.start_chunk + _RUN_ON) / sizes[s]
                epochs = f"epochs {at_start:.3g} at start, +{later - at_start:.3g} per {_RUN_ON} chunks"
            else:
                epochs = f"epochs {at_start:.3g} -> {schedule.position(s, end) / sizes[s]:.3g}"
            lines.append(f"    {name}: weight {stage.weights[name]:g} -> {t.per_chunk} {unit} per chunk; {epochs}")
        if idle:
            lines.append("    not read: " + ", ".join(idle))
    if schedule.num_chunks is not None:
        lines.append(f"  ends after chunk {schedule.num_chunks - 1} (exhausted='stop')")
    return lines
