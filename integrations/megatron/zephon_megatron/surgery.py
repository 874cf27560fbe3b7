"""Skipping steps under Megatron: the recipe's ``[surgery]`` and ``--iterations-to-skip`` as one journal.

Both ways of asking end in the loader state's surgery journal (``zephon_core.checkpoint.surgery``), so step
numbers, the ledger, ``zephon trace`` and every later resume know what was left out. Megatron's iterations
count from 1, as Zephon's global steps do, and one of its steps holds global batch / micro-batch Zephon
batches (one batch is one micro-batch of one data-parallel rank).

Two things must agree on every rank: the journal the loading ranks' pipelines hold and Megatron's
``args.iterations_to_skip``, for which Megatron runs its dummy step (the iteration counter advances, nothing
trains). Every journaled step ahead is therefore added to the flag's list, and the dummy step of a journaled
step reads nothing (``TrainStream.pass_skipped``): the lanes already leave its batches out. ``skips_at_start``
works the whole journal out from what every rank reads anyway (the recipe, the resumed loader state, its own
arguments), so all ranks agree without a collective; only the loading ranks then journal it in their
pipelines (``journal_in``).

Under a batch-size ramp a step's batch count varies and the journal cannot hold it: ``--iterations-to-skip``
keeps reading and dropping the skipped steps' micro-batches there (not journaled), and a skip in the recipe or
the state is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from zephon_core import StateError
from zephon_core.integration import (
    SurgeryJournal,
    SurgeryRequest,
    add_skips,
    apply_surgery,
    parse_lanes,
    skip_of,
    surgery_journal_of,
)
from zephon_core.integration.announce import surgery_line
from zephon_megatron.validate import ZephonMegatronError

FLAG = "--iterations-to-skip"


@dataclass(frozen=True)
class StartupSurgery:
    """What one start-up journals: the recipe's table and the flag's steps ahead (as ranges), in that order;
    ``batches_per_step`` None under a ramp (then nothing is skipped through the journal); ``note`` a line for
    rank 0's log, or empty."""

    recipe: SurgeryRequest
    flag: SurgeryRequest
    batches_per_step: int | None
    note: str = ""


def unpassed_batches(journal: SurgeryJournal, iteration: int, canonical_replicas: int) -> int:
    """Batches of the skipped steps that end at ``iteration`` which the lanes have not moved past yet: they pass a
    skip when the step after it is read, so a state saved right after skipped iterations (the last ones of a run)
    holds that many fewer delivered batches than Megatron's consumed samples say; 0 after a step that trained."""
    n, step = 0, iteration
    while (skip := journal.skip_at(step)) is not None:
        n, step = n + skip.batches_per_lane * canonical_replicas, step - 1
    return n


def ranges_of(steps: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Sorted distinct steps as contiguous ``(first, last)`` ranges: 3 4 5 9 -> (3, 5), (9, 9)."""
    out: list[list[int]] = []
    for s in sorted(set(steps)):
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return tuple((a, b) for a, b in out)


def _add(journal: SurgeryJournal, request: SurgeryRequest, B: int, C: int, lanes: Mapping[int, Any]) -> SurgeryJournal:
    """``journal`` with ``request``'s skips under the core's one rule (``add_skips``, which ``apply_surgery`` applies
    on a loading rank), so every rank refuses or accepts alike."""
    try:
        return add_skips(journal, [skip_of(first, last, B, C) for first, last in request.skips], lanes)
    except StateError as e:
        raise ZephonMegatronError(f"zephon: {request.where}: {e}") from None


def skips_at_start(args: Any, recipe: SurgeryRequest, state: Mapping[str, Any] | None, *, ramps: bool,
                   canonical_replicas: int) -> StartupSurgery:
    """The surgery this start-up journals, worked out alike on every rank; ``args.iterations_to_skip`` then holds
    every journaled step after ``args.iteration``. ``state``: the resumed loader state (None: a fresh run)."""
    iteration = int(getattr(args, "iteration", 0) or 0)
    asked = [int(s) for s in (getattr(args, "iterations_to_skip", None) or ())]
    journal = surgery_journal_of(state) if state is not None else SurgeryJournal()
    if ramps:
        if recipe.skips or journal.skips:
            raise ZephonMegatronError(
                f"zephon: {recipe.where if recipe.skips else 'the resumed loader state'} skips steps, but under a "
                f"batch-size ramp a step's batch count varies and the journal cannot hold it; use {FLAG} instead")
        note = (f"zephon: {FLAG} under a batch-size ramp: the skipped iterations' micro-batches are read and dropped, "
                "not journaled in the loader state" if any(s > iteration for s in asked) else "")
        return StartupSurgery(SurgeryRequest((), recipe.documents, recipe.where), SurgeryRequest(where=FLAG), None,
                              note)
    B = int(args.global_batch_size) // int(args.micro_batch_size)
    lanes = parse_lanes(state) if state is not None else {}
    journal = _add(journal, recipe, B, canonical_replicas, lanes)
    flag = SurgeryRequest(ranges_of(s for s in asked if s > iteration and journal.skip_at(s) is None), where=FLAG)
    journal = _add(journal, flag, B, canonical_replicas, lanes)
    ahead = {s for skip in journal.skips for s in range(max(skip.first, iteration + 1), skip.last + 1)}
    args.iterations_to_skip = sorted(set(asked) | ahead)
    return StartupSurgery(recipe, flag, B)


def journal_in(pipeline: Any, surgery: StartupSurgery) -> list[str]:
    """Journal ``surgery`` in a loading rank's restored ``pipeline`` (not yet iterated): a line per entry journaled
    now, for rank 0's log (none on a resume that finds them journaled already)."""
    lines = [surgery.note] if surgery.note else []
    for request in (surgery.recipe, surgery.flag):
        if request:
            done = apply_surgery(pipeline, request, surgery.batches_per_step or 1)
            lines += [surgery_line(request.where, d) for d in done]
    return lines
