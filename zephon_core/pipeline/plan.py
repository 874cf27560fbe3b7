"""A pipeline's plan: what it will do, as plain data, and the text ``explain()`` prints from it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zephon_core.lane.ops import DocOp, Op
from zephon_core.pipeline.options import Identity, Options


@dataclass(frozen=True)
class OperatorPlan:
    """One operator: its definition and how it runs."""

    name: str
    arguments: dict[str, object]
    parallelism: int = 1
    runner: str | None = None  # None for operators that run in the lane itself (pack, shuffle, batch)

    @property
    def how(self) -> str:
        if self.runner is None:
            return ""
        if self.parallelism == 1 and self.runner == "thread":
            return "inline"
        plural = {"thread": "threads", "process": "processes"}[self.runner] if self.parallelism > 1 else self.runner
        return f"{self.parallelism} {plural}"


@dataclass(frozen=True)
class Plan:
    """Everything ``Pipeline.explain()`` reports, computed without reading data."""

    identity: Identity
    options: Options
    work_source: tuple[str, ...]  # lines describing the work source
    operators: tuple[OperatorPlan, ...]
    threads: int  # started by this pipeline besides the caller's thread
    processes: int
    pipelines_per_node: int

    @classmethod
    def of(cls, identity: Identity, options: Options, work_source: Sequence[str], ops: Sequence[Op], pipelines_per_node: int) -> Plan:
        operators = []
        threads = (1 if options.prefetch > 0 else 0) + options.reader_threads
        processes = 0
        for op in ops:
            d = op.definition()
            name = d.pop("op")
            if isinstance(op, DocOp):
                operators.append(OperatorPlan(name, d, op.parallelism, op.runner))
                if op.runner == "process":
                    processes += op.parallelism
                elif op.parallelism > 1:
                    threads += op.parallelism
            else:
                operators.append(OperatorPlan(name, d))
        return cls(identity, options, tuple(work_source), tuple(operators), threads, processes, pipelines_per_node)


def render(plan: Plan) -> str:
    """The plan as the text of ``Pipeline.explain()``."""
    ident, opts, per_node = plan.identity, plan.options, plan.pipelines_per_node
    lines = ["Zephon pipeline plan"]
    lines.append(f"  data identity:         dp_group_id={ident.dp_group_id} of dp_degree={ident.dp_degree}")
    lines.append(f"  coordination identity: global_rank={ident.global_rank} of world_size={ident.world_size}")
    if ident.world_size > 1:
        lines.append(f"  aggregation:           {opts.aggregate_dir} run_id={opts.run_id} timeout={opts.aggregate_timeout_s:g}s (rank 0 merges)")
    balance = "  (uneven: canonical_replicas is not divisible by dp_degree)" if ident.uneven else ""
    lines.append(f"  lanes:                 canonical_replicas={ident.canonical_replicas}, owned {ident.lanes}{balance}")
    lines.append("  work source:")
    lines.extend("    " + line for line in plan.work_source)
    lines.append("  operators:")
    for op in plan.operators:
        args = ", ".join(f"{k}={v}" for k, v in op.arguments.items())
        if op.how:
            args += f"; {op.how}"
        lines.append(f"    {op.name}({args})")
    lines.append(f"  queues:                prefetch={opts.prefetch} batches, readahead={opts.readahead} chunk(s) per lane, reader_threads={opts.reader_threads}")
    lines.append(f"  this pipeline starts:  {plan.threads} thread(s), {plan.processes} process(es)")
    lines.append(
        f"  per node ({per_node} pipeline(s)): {plan.threads * per_node} thread(s), {plan.processes * per_node} process(es) "
        "besides the training processes"
    )
    return "\n".join(lines)
