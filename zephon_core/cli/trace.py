"""``zephon trace``: which documents (and token ranges) make up a global step.

With ``--journal STATE`` the step is traced as that run delivered it: its mixing journal replayed and its surgery
journal applied. A step the journal skipped is still cut (the lanes cut it and moved past it) and shown under a
header saying it did not train; a quarantined document is absent from the rows, as the lanes delivered them, and
named on a line of its own where the step held it before the quarantine.
"""

from __future__ import annotations

import argparse
from typing import Any

from zephon_core.cli.options import add_shape_options, journal_option, load, pipeline, progress_options
from zephon_core.cli.progress import Progress
from zephon_core.errors import CliError
from zephon_core.verify import curriculum_audit


def _step(p: Any, step: int, B: int, progress: Progress) -> tuple[list[Any], dict[str, Any]]:
    """Global step ``step``'s batches of ``p`` (one group, all lanes) and the state after them."""
    with p:
        it = iter(p)
        batches = []
        for n in range(step * B):
            b = next(it)
            progress.step(f"batch {n + 1} of step {n // B + 1}")
            if n >= (step - 1) * B:
                batches.append(b)
        return batches, p.checkpoint()


def _documents(batches: list[Any]) -> set[tuple[int, int]]:
    return {(s.source, s.document) for b in batches for segs in b.provenance for s in segs}


def _quarantined(make: Any, journal: Any, names: list[str], delivered: list[Any], a: argparse.Namespace, B: int,
                 progress: Progress) -> str:
    """One line: the quarantined documents the step held before the quarantine, now absent, and any it still holds
    (read before the quarantine took effect)."""
    from zephon_core.checkpoint.surgery import SurgeryJournal

    p = make()
    p.surgery = SurgeryJournal()
    before, _ = _step(p, a.step, B, progress)
    named = {(names.index(s), d) for q in journal.quarantines for s, d in q.documents if s in names}
    now = _documents(delivered)
    gone = sorted(named & _documents(before) - now)
    kept = sorted(named & now)
    line = "  quarantined (journaled): " + (", ".join(f"{names[s]}#{d}" for s, d in gone) or "none of them")
    line += " left out of this step as the lanes delivered it"
    if kept:
        line += "; still in it (read before the quarantine): " + ", ".join(f"{names[s]}#{d}" for s, d in kept)
    return line


def run(a: argparse.Namespace) -> int:
    from zephon_core.checkpoint.surgery import SurgeryJournal
    from zephon_core.lane.assignment import owned_lanes

    recipe = load(a.recipe)
    C = a.canonical_replicas or recipe.spec.canonical_replicas or 1
    B = a.batches_per_step or C
    if B % C:
        raise CliError(f"--batches-per-step {B} must be a multiple of canonical_replicas {C} "
                       "for a step's contents to be topology-free")
    if a.step < 1:
        raise CliError("--step counts from 1")

    def make() -> Any:
        return pipeline(recipe, a, dp_degree=1, dp_group_id=0, canonical_replicas=C, prefetch=0)

    p = make()
    journal = p.surgery
    # Every step is cut, a skipped one too (the lanes cut it and moved past it); the header says what did not train.
    p.surgery = SurgeryJournal((), journal.quarantines)
    names = [s.name for s in p.work_source.sources]
    progress = Progress(a.step * B * (2 if journal.quarantines else 1), a)
    batches, state = _step(p, a.step, B, progress)
    if journal:
        print(f"surgery journal of {a.journal}: skips: {', '.join(map(str, journal.skips)) or 'none'}; quarantined: "
              + ("; ".join(map(str, journal.quarantines)) or "none"))
    skip = next((s for s in journal.skips if s.first <= a.step <= s.last), None)
    if skip is not None:
        print(f"global step {a.step}: SKIPPED by surgery ({skip}, journaled): its data did not train; "
              f"the {B} batches left out (C={C}; lanes {owned_lanes(C, 1, 0)}):")
    else:
        print(f"global step {a.step}: {B} batches (C={C}; lanes {owned_lanes(C, 1, 0)})")
    for b in sorted(batches, key=lambda b: (b.lane, b.lane_index)):
        g = b.lane + b.cursor.chunk * C
        stage = curriculum_audit.stage_name(p.work_source, g)
        where = f"  (then at global chunk {g}" + (f", stage {stage!r})" if stage else ")")
        print(f"  lane {b.lane} batch {b.lane_index}  digest {b.digest}{where}")
        for r, segs in enumerate(b.provenance):
            parts = ", ".join(f"{names[s.source]}#{s.document}[{s.start}:{s.stop}]" for s in segs)
            print(f"    row {r}: {parts}")
    if journal.quarantines:
        print(_quarantined(make, journal, names, batches, a, B, progress))
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
