"""``zephon trace``: which documents (and token ranges) make up a global step."""

from __future__ import annotations

import argparse
from typing import Any

from zephon_core.cli.options import add_shape_options, journal_option, load, pipeline, progress_options
from zephon_core.cli.progress import Progress
from zephon_core.errors import CliError
from zephon_core.verify import curriculum_audit


def run(a: argparse.Namespace) -> int:
    from zephon_core.lane.assignment import owned_lanes

    recipe = load(a.recipe)
    C = a.canonical_replicas or recipe.spec.canonical_replicas or 1
    B = a.batches_per_step or C
    if B % C:
        raise CliError(f"--batches-per-step {B} must be a multiple of canonical_replicas {C} "
                       "for a step's contents to be topology-free")
    if a.step < 1:
        raise CliError("--step counts from 1")
    p = pipeline(recipe, a, dp_degree=1, dp_group_id=0, canonical_replicas=C, prefetch=0)
    names = [s.name for s in p.work_source.sources]
    progress = Progress(a.step * B, a)
    with p:
        it = iter(p)
        batches = []
        for n in range(a.step * B):
            b = next(it)
            progress.step(f"batch {n + 1} of step {n // B + 1}")
            if n >= (a.step - 1) * B:
                batches.append(b)
        state = p.checkpoint()
    print(f"global step {a.step}: {B} batches (C={C}; lanes {owned_lanes(C, 1, 0)})")
    for b in sorted(batches, key=lambda b: (b.lane, b.lane_index)):
        g = b.lane + b.cursor.chunk * C
        stage = curriculum_audit.stage_name(p.work_source, g)
        where = f"  (then at global chunk {g}" + (f", stage {stage!r})" if stage else ")")
        print(f"  lane {b.lane} batch {b.lane_index}  digest {b.digest}{where}")
        for r, segs in enumerate(b.provenance):
            parts = ", ".join(f"{names[s.source]}#{s.document}[{s.start}:{s.stop}]" for s in segs)
            print(f"    row {r}: {parts}")
    audit = curriculum_audit.audit_curriculum(p.work_source, curriculum_audit.chunks_read(state))
    print(audit.summary(p.work_source))
    for problem in audit.problems:
        print(f"  CURRICULUM: {problem}")
    return 1 if audit.problems else 0


def register(sub: Any) -> None:
    p = sub.add_parser("trace", help="which documents (and token ranges) make up a global step")
    p.add_argument("recipe")
    p.add_argument("--step", type=int, required=True, help="global step, from 1")
    p.add_argument("--canonical-replicas", type=int)
    p.add_argument("--batches-per-step", type=int, help="default: canonical_replicas")
    progress_options(p)
    journal_option(p)
    add_shape_options(p)
    p.set_defaults(fn=run)
