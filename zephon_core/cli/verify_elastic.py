"""``zephon verify-elastic``: a topology change at a checkpoint keeps every step's samples (simulated in
one process). With ``--journal STATE`` both topologies run with that state's journals (``cli.options.pipeline``):
the steps it skipped do not train on either, so ``--steps`` and ``--checkpoint-step`` count the steps that
trained."""

from __future__ import annotations

import argparse
from typing import Any

from zephon_core.cli.options import add_shape_options, journal_option, load, pipeline, progress_options
from zephon_core.cli.progress import Progress
from zephon_core.errors import CliError
from zephon_core.verify import curriculum_audit, simulate


def run(a: argparse.Namespace) -> int:
    recipe = load(a.recipe)
    C = a.canonical_replicas
    B = a.batches_per_step or C
    for G in (a.from_, a.to):
        if G > C:
            raise CliError(f"dp_degree {G} exceeds --canonical-replicas {C}")
        if B % G:
            raise CliError(f"--batches-per-step {B} is not a multiple of dp_degree {G}")
    if not 0 < a.checkpoint_step < a.steps:
        raise CliError(f"--checkpoint-step must be between 1 and --steps - 1 ({a.steps - 1})")
    progress = Progress(a.steps * 2, a)

    resumed = load(a.resume_recipe) if a.resume_recipe else recipe

    def maker(r: Any):
        return lambda G, gid: pipeline(r, a, dp_degree=G, dp_group_id=gid, canonical_replicas=C, prefetch=0)

    # The reference runs uninterrupted on the first topology (with the resumed recipe's curriculum throughout).
    ref_records, ref_state = simulate.run_phase(maker(resumed), simulate.Phase(a.from_, a.steps), B, None,
                                                lambda ph: progress.step(f"reference dp={ph.dp_degree}"))
    recs, state = simulate.run_phase(maker(recipe), simulate.Phase(a.from_, a.checkpoint_step), B, None,
                                     lambda ph: progress.step(f"elastic dp={ph.dp_degree}"))
    more, _ = simulate.run_phase(maker(resumed), simulate.Phase(a.to, a.steps - a.checkpoint_step), B, state,
                                 lambda ph: progress.step(f"elastic dp={ph.dp_degree}"))
    ref = maker(resumed)(1, 0)
    journal = ref.surgery
    if journal:  # both topologies ran with it: the steps counted below are the steps that trained
        print(f"surgery journal of {a.journal}, applied on both topologies: skips: "
              f"{', '.join(map(str, journal.skips)) or 'none'}; quarantined: "
              + ("; ".join(map(str, journal.quarantines)) or "none"))
    change = f"{a.from_} -> {a.to} at step {a.checkpoint_step}"
    change += f", resumed with {a.resume_recipe}" if a.resume_recipe else ""
    bad = simulate.first_mismatch(ref_records, recs + more, provenance=True)
    ws = ref.work_source
    audit = curriculum_audit.audit_curriculum(ws, curriculum_audit.chunks_read(ref_state))
    if bad is None and not audit.problems:
        steps = f"{a.steps} global steps" if not journal.skips else (
            f"{a.steps} trained steps (global steps 1..{_global_step(journal, a.steps)} less the skipped)")
        print(f"ok: {steps} identical: dp_degree {a.from_} throughout vs {change} "
              f"(C={C}, {B} batches per step)")
        print(audit.summary(ws))
        return 0
    if bad is not None:
        print(f"MISMATCH at global step {_global_step(journal, bad + 1)}: dp_degree {change} changes the samples "
              f"of that step (C={C}, {B} batches per step)")
    for problem in audit.problems:
        print(f"CURRICULUM: {problem}")
    return 1


def _global_step(journal: Any, trained: int) -> int:
    """The global step of the ``trained``-th step that trained, past the journal's skipped steps."""
    step = trained
    for skip in journal.skips:  # in step order
        if skip.first <= step:
            step += skip.last - skip.first + 1
    return step


def register(sub: Any) -> None:
    p = sub.add_parser("verify-elastic", help="check that a topology change at a checkpoint keeps every step's samples")
    p.add_argument("recipe")
    p.add_argument("--canonical-replicas", type=int, required=True)
    p.add_argument("--from", dest="from_", type=int, required=True, metavar="G1")
    p.add_argument("--to", type=int, required=True, metavar="G2")
    p.add_argument("--checkpoint-step", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batches-per-step", type=int, help="default: canonical_replicas")
    p.add_argument("--resume-recipe", metavar="RECIPE2", help="resume the checkpoint with this recipe "
                   "(e.g. with a stage appended); "
                   "the reference then runs RECIPE2 throughout")
    progress_options(p)
    journal_option(p)
    add_shape_options(p)
    p.set_defaults(fn=run)
