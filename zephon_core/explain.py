"""The text of ``Pipeline.explain()``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zephon_core.ops import DocOp

if TYPE_CHECKING:
    from zephon_core.pipeline import Pipeline


def worker_counts(pipeline: Pipeline) -> tuple[int, int]:
    """(threads, processes) this pipeline starts besides the caller's thread."""
    opts = pipeline._opts
    threads = (1 if opts.prefetch > 0 else 0) + opts.reader_threads
    processes = 0
    for op in pipeline._ops:
        if isinstance(op, DocOp):
            if op.runner == "process":
                processes += op.parallelism
            elif op.parallelism > 1:
                threads += op.parallelism
    return threads, processes


def render(pipeline: Pipeline, pipelines_per_node: int | None = None) -> str:
    from zephon_core.pipeline import default_pipelines_per_node

    ident = pipeline.identity
    opts = pipeline._opts
    per_node = pipelines_per_node or opts.pipelines_per_node or default_pipelines_per_node()
    lanes = ident.lanes
    lines = ["Zephon pipeline plan"]
    lines.append(f"  data identity:         dp_group_id={ident.dp_group_id} of dp_degree={ident.dp_degree}")
    lines.append(f"  coordination identity: global_rank={ident.global_rank} of world_size={ident.world_size}")
    if ident.world_size > 1:
        lines.append(f"  aggregation:           {opts.aggregate_dir} run_id={opts.run_id} timeout={opts.aggregate_timeout_s:g}s (rank 0 merges)")
    balance = "" if ident.canonical_replicas % ident.dp_degree == 0 else "  (uneven: canonical_replicas is not divisible by dp_degree)"
    lines.append(f"  lanes:                 canonical_replicas={ident.canonical_replicas}, owned {lanes}{balance}")
    lines.append("  work source:")
    lines.extend("    " + line for line in pipeline.work_source.describe())
    lines.append("  operators:")
    for op in pipeline._ops:
        d = op.definition()
        name = d.pop("op")
        args = ", ".join(f"{k}={v}" for k, v in d.items())
        if isinstance(op, DocOp):
            plural = {"thread": "threads", "process": "processes"}[op.runner] if op.parallelism > 1 else op.runner
            how = "inline" if op.parallelism == 1 and op.runner == "thread" else f"{op.parallelism} {plural}"
            args += f"; {how}"
        lines.append(f"    {name}({args})")
    lines.append(f"  queues:                prefetch={opts.prefetch} batches, readahead={opts.readahead} chunk(s) per lane, reader_threads={opts.reader_threads}")
    threads, processes = worker_counts(pipeline)
    lines.append(f"  this pipeline starts:  {threads} thread(s), {processes} process(es)")
    lines.append(
        f"  per node ({per_node} pipeline(s)): {threads * per_node} thread(s), {processes * per_node} process(es) "
        "besides the training processes"
    )
    return "\n".join(lines)
