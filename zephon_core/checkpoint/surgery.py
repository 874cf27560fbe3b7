"""The surgery journal: data a run was told to leave out, kept in its checkpoint state.

A skip of global steps ``a..b`` (from 1, inclusive) drops every batch of those steps: each lane
delivers ``batches_per_lane = batches_per_step / canonical_replicas`` batches a step on every
topology, so the skip is the lane batch numbers ``(a-1)*k .. b*k - 1`` of every lane. The lanes
still cut those batches and move their cursors past them (the batches count in ``delivered`` and
in the tally, as if they had trained), so step numbers after the skip keep their meaning: step
``b+1`` holds what it holds in a run without the skip, on any data-parallel degree.

In a state the journal is an optional top-level field, present only when something was done::

    "surgery": {"skips": [{"steps": [a, b], "batches_per_lane": k}, ...],
                "checksum": sha256 of the canonical JSON of "skips"}

A state without surgery is byte for byte what it was before the journal existed. Its own checksum
catches an edit of the journal alone; the state's checksum covers it as well.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from zephon_core.errors import StateError

FIELD = "surgery"


@dataclass(frozen=True, order=True)
class Skip:
    """Global steps ``first..last`` (from 1, inclusive) left out, at ``batches_per_lane`` batches a lane a step."""

    first: int
    last: int
    batches_per_lane: int

    def lane_batches(self) -> range:
        """The lane batch numbers (``Batch.lane_index``) this skip leaves out, the same in every lane."""
        k = self.batches_per_lane
        return range((self.first - 1) * k, self.last * k)

    def to_json(self) -> dict[str, Any]:
        return {"steps": [self.first, self.last], "batches_per_lane": self.batches_per_lane}

    def __str__(self) -> str:
        return f"steps {self.first}..{self.last}"


@dataclass(frozen=True, order=True)
class Quarantine:
    """``documents`` (source name, document number) left out of every lane from lane chunk ``from_chunks[lane]`` on:
    the first chunk the lane had not begun to read when the quarantine was journaled, so nothing the run already
    trained on, or will refill on a restore, changes."""

    documents: tuple[tuple[str, int], ...]
    from_chunks: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"documents": [list(d) for d in self.documents], "from_lane_chunks": list(self.from_chunks)}

    def __str__(self) -> str:
        return ", ".join(f"{s}#{d}" for s, d in self.documents)


def skip_of(first: int, last: int, batches_per_step: int, canonical_replicas: int) -> Skip:
    """The skip of global steps ``first..last`` of ``batches_per_step`` batches; refused (StateError) when the steps
    are out of order or a step's batches are not a whole number per lane."""
    if isinstance(first, bool) or isinstance(last, bool) or not 1 <= first <= last:
        raise StateError(f"a skip needs steps A..B with 1 <= A <= B, got {first}..{last}")
    if batches_per_step < 1 or batches_per_step % canonical_replicas:
        raise StateError(f"batches per step {batches_per_step} must be a positive multiple of canonical_replicas "
                         f"{canonical_replicas}: a skipped step must hold the same batches on every topology")
    return Skip(first, last, batches_per_step // canonical_replicas)


def refuse_begun(skip: Skip, lanes: Mapping[int, Any]) -> None:
    """Refuse (StateError) a skip when one of ``lanes`` (lane -> its ``LaneState``) already delivered a batch of it."""
    begun = [(lane, ls.delivered) for lane, ls in sorted(lanes.items()) if ls.delivered > skip.lane_batches().start]
    if begun:
        lane, n = begun[0]
        raise StateError(f"cannot skip {skip}: lane {lane} already delivered {n} batches "
                         f"({skip.batches_per_lane} a step), past step {skip.first - 1}; "
                         f"skip from a checkpoint taken before step {skip.first}")


def add_skips(journal: SurgeryJournal, skips: Iterable[Skip], lanes: Mapping[int, Any]) -> SurgeryJournal:
    """``journal`` with ``skips`` added, given ``lanes`` (lane -> its ``LaneState``: what each delivered): the one skip
    rule, behind ``zephon skip``, ``Pipeline.skip_steps``, a recipe's ``[surgery]`` (``apply_surgery``) and Megatron.

    A skip journaled identically already is a no-op, whatever the lanes delivered since: a request stays in a recipe
    for the rest of a run, and asking twice is harmless. A skip that overlaps a journaled one but is not it, or one
    of steps a lane already delivered, is refused (StateError) naming the steps and the fix; nothing is added then.
    """
    for skip in skips:
        if skip in journal.skips:
            continue
        refuse_begun(skip, lanes)  # first: steps already trained want a roll-back, whatever the journal holds
        clash = next((s for s in journal.skips if s.first <= skip.last and skip.first <= s.last), None)
        if clash is not None:
            raise StateError(f"cannot skip {skip} ({skip.batches_per_lane} batches a lane a step): the journal "
                             f"already skips {clash} ({clash.batches_per_lane} a lane a step), which overlaps it; "
                             f"ask for exactly {clash} (journaled: nothing to do) or for steps outside it")
        journal = journal.with_skip(skip)
    return journal


@dataclass(frozen=True)
class SurgeryJournal:
    """What surgery a run has had; empty for almost every run."""

    skips: tuple[Skip, ...] = ()
    quarantines: tuple[Quarantine, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.skips or self.quarantines)

    def with_skip(self, skip: Skip) -> SurgeryJournal:
        """This journal and ``skip`` (once; kept in step order), unchecked: a request goes through ``add_skips``."""
        return self if skip in self.skips else SurgeryJournal(tuple(sorted({*self.skips, skip})), self.quarantines)

    def with_quarantine(self, q: Quarantine) -> SurgeryJournal:
        """This journal and ``q`` (once; kept in the order given)."""
        return self if q in self.quarantines else SurgeryJournal(self.skips, (*self.quarantines, q))

    def union(self, other: SurgeryJournal) -> SurgeryJournal:
        out = self
        for skip in other.skips:
            out = out.with_skip(skip)
        for q in other.quarantines:
            out = out.with_quarantine(q)
        return out

    def skip_at(self, step: int) -> Skip | None:
        """The skip that leaves out global step ``step`` (None: the step trains); a trainer runs no step for it."""
        return next((s for s in self.skips if s.first <= step <= s.last), None)

    def skipper(self) -> LaneSkips | None:
        """What a lane checks for every batch it delivers (None: nothing to skip)."""
        return LaneSkips(self) if self.skips else None

    def to_json(self) -> dict[str, Any]:
        body = {"skips": [s.to_json() for s in self.skips], "quarantines": [q.to_json() for q in self.quarantines]}
        return {**body, "checksum": body_checksum(body)}


class LaneSkips:
    """Whether a lane batch number falls in a skipped range; ranges in order, so the check is a comparison or two."""

    __slots__ = ("_ranges",)

    def __init__(self, journal: SurgeryJournal) -> None:
        self._ranges = sorted((r.start, r.stop) for r in (s.lane_batches() for s in journal.skips) if r)

    def __contains__(self, lane_index: int) -> bool:
        return any(lo <= lane_index < hi for lo, hi in self._ranges)


def body_checksum(body: Mapping[str, Any]) -> str:
    """sha256 of a state field's body as canonical JSON: the own checksum of an optional field (the surgery
    journal, the steering clock) that catches an edit of that field alone."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def surgery_journal_of(state: Mapping[str, Any]) -> SurgeryJournal:
    """The journal of a state (empty when it has none); a malformed or altered journal is a StateError naming it."""
    raw = state.get(FIELD)
    if raw is None:
        return SurgeryJournal()
    entries = ("skips", "quarantines")
    if (not isinstance(raw, Mapping) or set(raw) != {*entries, "checksum"}
            or not all(isinstance(raw[k], list) for k in entries)):
        raise StateError(f"state field {FIELD} must have exactly the fields checksum, quarantines and skips (lists)")
    if raw["checksum"] != body_checksum({k: raw[k] for k in entries}):
        raise StateError(f"state field {FIELD}.checksum does not match its entries: the journal was altered "
                         "or corrupted")
    journal = SurgeryJournal(tuple(sorted({_skip(e, f"{FIELD}.skips[{n}]") for n, e in enumerate(raw["skips"])})),
                      tuple(_quarantine(e, f"{FIELD}.quarantines[{n}]") for n, e in enumerate(raw["quarantines"])))
    if not journal:
        raise StateError(f"state field {FIELD} is empty: a state without surgery has no {FIELD} field")
    return journal


def _skip(entry: Any, where: str) -> Skip:
    if not isinstance(entry, Mapping) or set(entry) != {"steps", "batches_per_lane"}:
        raise StateError(f"state field {where} must have exactly the fields batches_per_lane and steps")
    steps, k = entry["steps"], entry["batches_per_lane"]
    if (not isinstance(steps, list) or len(steps) != 2 or not all(type(v) is int for v in steps)
            or not 1 <= steps[0] <= steps[1] or type(k) is not int or k < 1):
        raise StateError(f"state field {where} must be steps [A, B] with 1 <= A <= B and batches_per_lane >= 1")
    return Skip(steps[0], steps[1], k)


def _quarantine(entry: Any, where: str) -> Quarantine:
    if not isinstance(entry, Mapping) or set(entry) != {"documents", "from_lane_chunks"}:
        raise StateError(f"state field {where} must have exactly the fields documents and from_lane_chunks")
    docs, firsts = entry["documents"], entry["from_lane_chunks"]
    if (not isinstance(docs, list) or not docs or not all(
            isinstance(d, list) and len(d) == 2 and isinstance(d[0], str) and type(d[1]) is int and d[1] >= 0
            for d in docs)
            or not isinstance(firsts, list) or not all(type(k) is int and k >= 0 for k in firsts)):
        raise StateError(f"state field {where} must be documents [[source, number], ...] and from_lane_chunks "
                         "[a lane chunk per lane]")
    return Quarantine(tuple((s, d) for s, d in docs), tuple(firsts))
