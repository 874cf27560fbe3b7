"""Whether a checkpoint state resumes into a pipeline whose data definition differs, and why or why not.

The operators must be the same. The curriculum may differ only from a global
chunk ``G`` on (``checkpoint.compat.divergence``: stages appended, or not yet
started stages changed) and only if the state's lanes have read no chunk at
or after ``G``: what a lane has read ends in the chunk of its cursor, or — when
its cursor is inside a partly delivered shuffle window — of the window's end,
or — in a fit packing mode — of the end of the fit window it stands in,
found by refilling that window with the checkpoint's own curriculum
(``checkpoint.compat.checkpoint_curriculum``): from ``G`` on its chunks are not
the new one's, and a window that reaches past ``G`` ends elsewhere with them.
The chunk of a position counts even at its first document: a pad row closed
there because that document did not fit. The first chunk a refused stage may
start at is one past the last chunk read under the old curriculum. Where that
is before ``G``, the restore, which refills with the new one, reads the same
chunks and so the same rows (the two agree before ``G``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from zephon_core.batch import Cursor
from zephon_core.checkpoint.compat import Divergence, checkpoint_curriculum, divergence
from zephon_core.checkpoint.merge import diff_definitions
from zephon_core.checkpoint.state import LaneState
from zephon_core.curriculum.definition import parse_definition
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.errors import ConfigError
from zephon_core.lane.ops import FIT_MODES
from zephon_core.lane.packing import Position
from zephon_core.lane.stream import window_end
from zephon_core.pipeline.engine import OperatorChain

CHANGED_DATA = "the checkpoint was taken with different data (checkpoint vs this pipeline)"


@dataclass(frozen=True)
class Verdict:
    """A state against a pipeline: ``accepted``, ``message`` (one line) and the differences behind it."""

    accepted: bool
    message: str
    differences: list[str] = field(default_factory=list)


def _summary(diffs: list[str]) -> str:
    return "; ".join(diffs[:5]) + ("; ..." if len(diffs) > 5 else "")


def last_read_chunk(lane: int, cursor: Cursor, C: int, work_source: WorkSource, chain: Callable[[], OperatorChain]) -> int:
    """The last global chunk that lane ``lane``'s rows up to ``cursor`` depend on (-1: none): up to the end of
    its shuffle window when the cursor is inside one, refilled with ``work_source`` (the checkpoint's curriculum).

    That is the chunk of the packer position after those rows, even at the chunk's first document: a pad
    row closes before a document that does not fit, so it depends on that document's length (and the last
    row of the data on whether the chunk exists); a concat row never ends there.
    """
    k, i, t = cursor.chunk, cursor.document, cursor.token
    ops = chain() if cursor.delivered_in_window or t else None
    window = ops.shuffle.window if ops is not None and ops.shuffle is not None and cursor.delivered_in_window else 0
    if ops is not None and (window or ops.pack.mode in FIT_MODES):
        k, i, t = window_end(lane, C, work_source, ops.doc_ops, ops.pack, window, Position(k, i, t))
    return lane + k * C if (k, i, t) != (0, 0, 0) else -1


def _reach(last_read: Mapping[int, int]) -> tuple[int, int | None]:
    """One past the last global chunk of ``last_read`` (lane -> its last read chunk), and the lane that read it."""
    frontier, who = 0, None
    for lane, g in sorted(last_read.items()):
        if g + 1 > frontier:
            frontier, who = g + 1, lane
    return frontier, who


def _where(work_source: WorkSource, g: int) -> str:
    """``g`` in the units a schedule plans in, where the work source knows them."""
    planned = getattr(work_source, "planned_tokens", None)
    tokens = planned(g) if callable(planned) else None
    if tokens is None:
        return ""
    per_step = getattr(work_source, "tokens_per_step", None)
    step = f", step ~{tokens / per_step:.0f}" if per_step else ""
    return f" (~{tokens:.4g} tokens planned{step})"


def resume_verdict(state: Mapping[str, Any], lanes: Mapping[int, LaneState], definition: Mapping[str, Any], work_source: WorkSource,
                   chain: Callable[[], OperatorChain]) -> Verdict:
    """Whether ``state`` (with parsed ``lanes``) resumes into a pipeline of ``definition`` over ``work_source``
    (``chain`` gives its operators, needed only to refill a partly delivered shuffle window)."""
    old = state["definition"]
    if old == definition:
        return Verdict(True, "same data definition")
    unsteered = _unsteered(old, definition)
    if unsteered is not None:
        return Verdict(False, unsteered)
    others = sorted((set(old) | set(definition)) - {"work_source"})
    diffs = [d for k in others for d in diff_definitions(old.get(k), definition.get(k), k)]
    found = divergence(old.get("work_source", {}), definition.get("work_source", {}))
    if found is None and not diffs:
        return Verdict(True, "same data")
    if diffs or found is None or found.chunk is None:
        diffs += found.reasons if found is not None else []
        return Verdict(False, f"{CHANGED_DATA}: {_summary(diffs)}", diffs)
    C = int(state["canonical_replicas"])
    return _stage_verdict(found, old.get("work_source", {}), lanes, C, work_source, chain)


def _unsteered(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """Why a state whose mixture was steered cannot resume into a pipeline with no journal (None: it can).

    The steered stages the lanes have not reached look like stages changed after the state's position, which a
    resume accepts; the run would then silently train the recipe's own mixture from there on."""
    journal = parse_definition(old).journal
    if journal is None or not journal.decisions or parse_definition(new).journal is not None:
        return None
    n = len(journal.decisions)
    return (f"the checkpoint's data is steered by a mixing journal ({n} decision{'s' * (n > 1)}, the last at step "
            f"{journal.decisions[-1].step}); resume with mixing on (MixingLoader; TorchTitan: mixing = true, Megatron: "
            "--zephon-mixing) so its decisions are replayed, with the recipe's [mixing] table")


def _stage_verdict(found: Divergence, old: Mapping[str, Any], lanes: Mapping[int, LaneState], C: int,
                   work_source: WorkSource, chain: Callable[[], OperatorChain]) -> Verdict:
    assert found.chunk is not None
    changes = f"{found.stage} changes the data from global chunk {found.chunk}{_where(work_source, found.chunk)}"
    try:
        read_from: WorkSource = checkpoint_curriculum(old, work_source)
        unknown = None
    except ConfigError as e:
        # A window this pipeline's curriculum refills before G is the one the checkpoint's filled (they agree
        # there), so the verdict stands; only the end of a window reaching past G is not what the lanes read.
        read_from, unknown = work_source, str(e)
    last_read = {lane: last_read_chunk(lane, ls.cursor, C, read_from, chain) for lane, ls in lanes.items()}
    frontier, who = _reach(last_read)
    read = f"up to global chunk {frontier - 1} (lane {who})" if who is not None else "no chunk yet"
    if found.chunk >= frontier:
        kept = f"the checkpoint's lanes have read {read}, so what they delivered stays the same"
        return Verdict(True, f"{changes}; {kept}", found.reasons)
    refilled = [lane for lane, g in last_read.items() if g >= found.chunk and lanes[lane].cursor.delivered_in_window]
    if unknown is not None and refilled:  # where those windows end under the checkpoint's curriculum is not known
        read = f"chunks from global chunk {found.chunk} on (lane {refilled[0]})"
        first_ok = f"after them; this pipeline cannot name the first chunk ({unknown})"
    else:
        first_ok = f"at global chunk {frontier} or later{_where(read_from, frontier)}"
    return Verdict(
        False,
        f"{CHANGED_DATA}: {changes}, but the checkpoint's lanes have read {read}; "
        f"a stage that is appended or changed must start {first_ok}: {_summary(found.reasons)}",
        found.reasons,
    )
