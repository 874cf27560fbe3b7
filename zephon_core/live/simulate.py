"""Live mode in one process: replica groups as objects, a scripted fault at any step, every committed step recorded.

The same protocol torchft drives (quorum, ``begin``, SUM of ``exchange``, commit vote,
``settle``, healing by ``state_dict``), with the collectives replaced by a sum in memory, so
that thousands of schedules can be checked in seconds (the property tests) and the per-step
cost measured without a network (bench). The real-process proof with torchft's lighthouse
and managers is ``tests/reliability/test_live_torchft.py``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon_core.live.lanes import LiveLanes
from zephon_core.pipeline import Pipeline

#: ``(lane, batch number within the lane, content digest)``: one sample of a step, whoever read it.
Sample = tuple[int, int, str]
#: ``make(slots, slot) -> Pipeline``: the recipe's pipeline for one data-parallel rank of a replica group.
MakePipeline = Callable[[int, int], Pipeline]

KINDS = ("die_before_exchange", "die_after_exchange", "join", "lag")


@dataclass(frozen=True)
class Fault:
    """At the first attempt of committed step ``step``: a replica dies before or after the step's allreduce, a new
    replica joins, or a replica's commit fails alone (``lag``: it heals on the next step)."""

    step: int
    kind: str
    replica: int = 0
    """Which replica (its position among the members, modulo their number); unused for ``join``."""


@dataclass
class LiveRun:
    """What a simulated run committed, step by step."""

    steps: dict[int, list[Sample]] = field(default_factory=dict)
    participants: dict[int, int] = field(default_factory=dict)
    discarded: int = 0
    heals: int = 0
    final: list[dict[str, Any]] = field(default_factory=list)
    """The durable checkpoint of each slot at the end (one replica's), ready to merge."""


class _Replica:
    def __init__(self, rid: int, make: MakePipeline, slots: int, k: int, source: _Replica | None) -> None:
        self.rid = rid
        self.slots = [LiveLanes(make(slots, j), k) for j in range(slots)]
        if source is not None:
            self.heal(source)

    @property
    def step(self) -> int:
        return self.slots[0].step

    def heal(self, source: _Replica) -> None:
        for mine, theirs in zip(self.slots, source.slots):  # rank j of the joiner from rank j of the source
            mine.load_state_dict(theirs.state_dict())

    def close(self) -> None:
        for live in self.slots:
            live.close()


def reference_steps(make: MakePipeline, canonical_replicas: int, batches_per_lane: int,
                    steps: int) -> dict[int, list[Sample]]:
    """Each step's samples in an uninterrupted run: lane ``l``'s batches ``s*k .. s*k + k - 1`` for step ``s``."""
    out: dict[int, list[Sample]] = defaultdict(list)
    with make(1, 0) as p:
        it = iter(p)
        for _ in range(steps * batches_per_lane * canonical_replicas):
            b = next(it)
            out[b.lane_index // batches_per_lane].append((b.lane, b.lane_index, b.digest))
    return {s: sorted(v) for s, v in out.items()}


def simulate(make: MakePipeline, *, slots: int, batches_per_lane: int, replicas: int, steps: int,
             faults: Iterable[Fault] = (), mode: str = "sync") -> LiveRun:
    """Run ``steps`` committed steps with ``replicas`` groups at the start and ``faults`` on the way."""
    if mode not in ("sync", "async"):
        raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
    pending: dict[int, list[Fault]] = defaultdict(list)
    for f in faults:
        pending[f.step].append(f)
    run, next_id = LiveRun(), replicas
    members = [_Replica(r, make, slots, batches_per_lane, None) for r in range(replicas)]
    try:
        while len(run.steps) < steps:
            step = max(m.step for m in members)
            due = pending.pop(step, [])
            for _ in (f for f in due if f.kind == "join"):
                members.append(_Replica(next_id, make, slots, batches_per_lane, None))
                next_id += 1
            _attempt(run, members, step, [f for f in due if f.kind != "join"], mode)
        leader = max(members, key=lambda m: m.step)
        run.final = [live.checkpoint() for live in leader.slots]
    finally:
        for m in members:
            m.close()
    return run


def _attempt(run: LiveRun, members: list[_Replica], step: int, faults: list[Fault], mode: str) -> None:
    """One step attempt: quorum and healing, batches, the allreduce, the commit vote, settling."""
    source = next(m for m in members if m.step == step)
    behind = [m for m in members if m.step != step]
    for m in behind if mode == "sync" else ():  # sync quorum: the lagging heal before the step
        m.heal(source)
        run.heals += 1
    participating = [m for m in members if m.step == step]
    P = len(participating)
    contributions: dict[int, list[np.ndarray]] = {}
    samples: dict[int, list[Any]] = {}
    for m in members:
        index = participating.index(m) if m in participating else None
        live_steps = [live.begin(P, index) for live in m.slots]
        samples[m.rid] = [(b.lane, b.lane_index, b.digest) for ls in live_steps for b in ls.batches]
        contributions[m.rid] = [live.exchange() for live in m.slots]
    victims = {f.kind: members[f.replica % len(members)] for f in faults}
    if "die_before_exchange" in victims:  # the allreduce fails: nobody commits
        _leave(members, victims["die_before_exchange"])
        for m in members:
            for live, table in zip(m.slots, contributions[m.rid]):
                live.settle(table, P, committed=False)
        run.discarded += 1
        return
    summed = [np.sum([contributions[m.rid][j] for m in members], axis=0) for j in range(len(source.slots))]
    for m in (m for m in members if m not in participating):  # async: healing applies at the commit
        m.heal(source)
        run.heals += 1
    if "die_after_exchange" in victims:  # its gradient made it into the step: the others commit
        _leave(members, victims["die_after_exchange"])
    lagging = victims.get("lag")
    for m in members:
        for live, table in zip(m.slots, summed):
            live.settle(table, P, committed=m is not lagging)
    if all(m is lagging for m in members):  # nobody committed: the step is tried again
        run.discarded += 1
        return
    run.steps[step] = sorted(s for rid in samples for s in samples[rid])
    run.participants[step] = P


def _leave(members: list[_Replica], victim: _Replica) -> None:
    if len(members) > 1:
        members.remove(victim)
        victim.close()


def violations(run: LiveRun, reference: Mapping[int, list[Sample]]) -> list[str]:
    """Every committed step whose samples differ from the uninterrupted run's, and every sample lost or repeated."""
    out = [f"step {s}: {len(run.steps.get(s, []))} samples, the reference has {len(ref)}; they differ"
           for s, ref in sorted(reference.items()) if run.steps.get(s) != ref]
    seen: dict[Sample, int] = defaultdict(int)
    for samples in run.steps.values():
        for sample in samples:
            seen[sample] += 1
    out += [f"sample {s} committed {n} times" for s, n in seen.items() if n != 1]
    return out
