"""A writer merging the tree nodes it owns in one round (what never came: ``account``)."""

from __future__ import annotations

import random
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from zephon_core.checkpoint.account import Account, Member, PartsMissing, span_label
from zephon_core.checkpoint.merge import merge_parsed
from zephon_core.checkpoint.names import merged_file, part_file
from zephon_core.checkpoint.records import Moved, Part, Round, decode_merged, decode_part
from zephon_core.checkpoint.state import LaneState, parse_lanes
from zephon_core.checkpoint.tree import strides_of
from zephon_core.errors import AggregationError, StateError
from zephon_core.lane.assignment import owned_lanes

T = TypeVar("T")

#: The jitter's own generator. The process-wide ``random`` belongs to the training: Megatron saves its
#: state in every checkpoint (``rng_state``) and restores it on resume, so draws from it here, whose
#: number depends on timing and on the rank's role in a round, would change the training's Python
#: stream and make peers' checkpoints differ (issue #42: two context-parallel peers writing one
#: ``model_optim_rng.pt`` of different lengths left a torn archive).
JITTER = random.Random()

#: A rank's part in a round, step by step: it yields the seconds to pause before its next step and
#: returns its result. ``Aggregator.checkpoint`` sleeps through the pauses; a simulation of many ranks
#: can run them as tasks of one event loop (bench/goals/p4s_scale/aggregate_scale.py).
Steps = Generator[float, None, T]


def now() -> float:
    return time.monotonic()


def pause(seconds: float) -> float:
    """A pause, jittered so that ranks that started together do not look at the same instant."""
    return max(0.0, seconds) * JITTER.uniform(0.85, 1.15)


@dataclass(frozen=True)
class Subtree:
    """A node's merge so far: the merged state (and its lanes), and while every rank writes, the strides that fit all its ranks."""

    state: dict[str, Any]
    lanes: dict[int, LaneState] | None  # parsed when first merged (a writer that merges nothing never needs them)
    strides: dict[str, Any] | None


def leaf(local_state: dict[str, Any], rnd: Round) -> Subtree:
    """A writer's own contribution; while every rank writes, with the strides that would place it where it is."""
    if rnd.writers.stride is not None:
        return Subtree(local_state, None, None)
    topo = local_state["topology"]
    G, g, r = topo.get("dp_degree"), topo.get("dp_group_id"), topo.get("global_rank")
    if not (isinstance(G, int) and isinstance(g, int) and isinstance(r, int)):
        return Subtree(local_state, None, {"groups": 0, "candidates": []})
    return Subtree(local_state, None, {"groups": G, "candidates": strides_of(r, g, G, rnd.writers.world_size)})


class PartWaits:
    """How long a merging writer waited for each level's parts in its last round; timing only.

    Parts of merging writers come a level's merge later than leaves' do; looking for
    them before they can be there only costs operations. A writer first looks at a
    level's parts a little before they came the last time (same tree), then as usual.
    """

    def __init__(self) -> None:
        self.came: dict[tuple[int, int], float] = {}  # (writers, level) -> seconds from the start of the wait

    def first_look(self, slots: int, level: int) -> float:
        return 0.8 * self.came.get((slots, level), 0.0)

    def learn(self, slots: int, level: int, waited: float) -> None:
        self.came = {k: v for k, v in self.came.items() if k[0] == slots}
        self.came[(slots, level)] = waited


class RoundReplaced(Exception):
    """The leader replaced this round (after it failed) by ``to``."""

    def __init__(self, to: Round) -> None:
        super().__init__(to.token)
        self.to = to


def join_strides(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    if a is None or b is None:
        return None
    if a["groups"] != b["groups"]:
        return {"groups": a["groups"], "candidates": []}
    return {"groups": a["groups"], "candidates": sorted(set(a["candidates"]) & set(b["candidates"]))}


class Gatherer:
    """The writer of ``slot`` in round ``rnd``, merging its nodes level by level up to ``top``."""

    def __init__(self, me: Member, rnd: Round, slot: int, deadline: float, watch_moved: bool, waits: PartWaits) -> None:
        self.me, self.rnd, self.slot, self.waits = me, rnd, slot, waits
        self.tree = me.tree(rnd.writers)
        self.deadline = deadline
        self.watch_moved = watch_moved  # a follower that merges: the leader may replace a failed round

    def run(self, own: Subtree, top: int) -> Steps[Subtree]:
        """The merge of node ``(top, slot)``. When children gave up waiting (their parts hold accounts), it
        still waits for the others up to the top, so that its own account (``PartsMissing``) holds them all."""
        acc, gave_up = own, list[Account]()
        for level in range(1, top + 1):
            kids = self.tree.children(level, self.slot)
            try:
                parts, accounts = yield from self.await_parts(level - 1, kids)
            except PartsMissing as m:
                m.accounts[:0] = gave_up
                raise
            gave_up += accounts
            if not gave_up:
                acc = self.merge(level, acc, parts)
        if gave_up:
            raise PartsMissing(top - 1, [], {}, gave_up)
        return acc

    def merge(self, level: int, acc: Subtree, parts: dict[int, Part]) -> Subtree:
        w, S, F = self.rnd.writers, self.tree.slots, self.tree.fan_in
        firsts = [self.slot, *sorted(parts)]
        states = [acc.state] + [parts[c].state or {} for c in firsts[1:]]
        lanes = [acc.lanes if acc.lanes is not None else parse_lanes(acc.state)] + [parts[c].lanes for c in firsts[1:]]
        labels = [span_label(w, level - 1, c, S, F) for c in firsts]
        try:
            state, merged = merge_parsed(states, lanes, world_size=self.me.world_size, labels=labels)
        except StateError as e:
            raise AggregationError(f"checkpoint aggregation in {self.me.folder.path}: {e}") from None
        strides = acc.strides
        for c in firsts[1:]:
            strides = join_strides(strides, parts[c].strides)
        return Subtree(state, merged, strides)

    def await_parts(self, level: int, kids: list[int]) -> Steps[tuple[dict[int, Part], list[Account]]]:
        """The parts of ``kids`` (first slots of nodes at ``level``), looked for until the deadline, and the
        accounts of those that gave up waiting themselves.

        It looks at one missing part at a time, again and again until it comes, and
        then at once at the next one: on a folder a look costs microseconds. On an
        object store, where it costs a round trip, a part that comes is followed by
        one look at all the missing ones together (parts tend to come together).
        """
        d, writers = self.me.folder, self.rnd.writers
        names = {c: part_file(writers.rank_of(c)) for c in kids}
        got: dict[int, Part] = {}
        gave_up: dict[int, Account] = {}
        seen: dict[int, bytes | None] = {}
        start = now()
        delay, moved_at = d.pacing.first_s, start + d.pacing.moved_check_s
        look = kids[:1] if d.local else list(kids)
        first = min(self.waits.first_look(self.tree.slots, level), self.deadline - start)
        if first > 0:
            yield pause(first)
        while True:
            blobs = d.get_many([names[c] for c in look])
            came = False
            for c in look:
                seen[c] = blobs.get(names[c])
                part = decode_part(seen[c], d.file(names[c]), self.rnd, level, c)
                if part is not None and part.account is not None:
                    gave_up[c], came = Account.from_json(part.account), True
                elif part is not None:
                    got[c], came = self.accept(part, level, c, d.file(names[c])), True
            pending = [c for c in kids if c not in got and c not in gave_up]
            if not pending:
                self.waits.learn(self.tree.slots, level, now() - start)
                return got, list(gave_up.values())
            if came and (d.local or len(look) == 1):
                look, delay = (pending[:1] if d.local else pending), d.pacing.first_s
                continue
            look = pending[:1]
            t = now()
            if t > self.deadline:
                raise PartsMissing(level, pending, seen, list(gave_up.values()))
            if self.watch_moved and t >= moved_at:
                self.raise_if_replaced()
                moved_at = t + d.pacing.moved_check_s
            yield pause(min(delay, self.deadline - t))
            delay = min(delay * 2, d.pacing.merge_max_s)

    def accept(self, part: Part, level: int, slot: int, where: str) -> Part:
        if part.error is not None:
            raise AggregationError(part.error)
        if level == 0:
            self.check_leaf(slot, part.state or {}, where)
        return part

    def raise_if_replaced(self) -> None:
        d = self.me.folder
        data = d.get(merged_file(self.rnd.token))
        if data is not None:
            rec = decode_merged(data, d.file(merged_file(self.rnd.token)), self.rnd.token, self.me.world_size)
            if isinstance(rec, Moved):
                raise RoundReplaced(rec.to)

    def check_leaf(self, slot: int, state: dict[str, Any], where: str) -> None:
        """A writer's own state: from the rank that should write it, for the group it should write for."""
        w = self.rnd.writers
        topo, expected = state["topology"], w.rank_of(slot)
        if topo.get("global_rank") != expected:
            raise AggregationError(f"{where}: holds the state of global_rank={topo.get('global_rank')}, expected {expected}")
        if topo.get("world_size") != self.me.world_size:
            raise AggregationError(f"{where}: rank {expected} has world_size={topo.get('world_size')}, the leader has {self.me.world_size}")
        G, g = topo.get("dp_degree"), topo.get("dp_group_id")
        if w.stride is not None and (g, G) != (slot, w.groups):
            raise AggregationError(
                f"{where}: global rank {expected} writes as the representative of dp group {slot} of {w.groups} (stride {w.stride}) but holds "
                f"dp_group_id={g} of dp_degree={G}: a rank's data identity changed since the round that chose the representatives"
            )
        if isinstance(G, int) and isinstance(g, int) and 0 <= g < G and sorted(int(k) for k in state["lanes"]) != owned_lanes(
                state["canonical_replicas"], G, g):
            raise AggregationError(f"{where}: global rank {expected} holds lanes other than those of dp group {g} of {G}")
