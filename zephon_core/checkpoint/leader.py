"""The leader's part in one round (global rank 0): open it, merge the top of the tree, publish."""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass, field
from typing import Any

from zephon_core.checkpoint.account import Account, PartsMissing, account_of, describe, examine
from zephon_core.checkpoint.gather import Gatherer, Member, PartWaits, Steps, Subtree, leaf, now, pause
from zephon_core.checkpoint.merge import merge_parsed
from zephon_core.checkpoint.names import ROUND_FILE, TMP_PREFIX, merged_file, new_token, part_file, rank_of_part
from zephon_core.checkpoint.records import Round, decode_round, encode_merged, encode_moved, encode_round
from zephon_core.checkpoint.state import canonical_json, parse_lanes
from zephon_core.checkpoint.tree import Writers
from zephon_core.errors import AggregationError

#: The longest the leader waits, once its time ran out, for merging writers to say who never came below them.
SETTLE_S = 5.0


@dataclass
class LeaderMemory:
    """What the leader carries from one round to the next."""

    started: bool = False  # the launch's first round (and its clean-up) is behind us
    number: int = 0  # the last round's number
    unpublished: list[str] = field(default_factory=list)  # rounds that failed: readers waiting there are sent on
    moved: list[str] = field(default_factory=list)  # redirect files, removed once the round they point to is published
    published: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=2))
    parts: PartWaits = field(default_factory=PartWaits)


class LeaderRound:
    """One round as the leader runs it::

        open      announced round, or a fresh one in round.json (every rank writes;
                  readers of failed rounds are sent to it)
        gather    merge the parts of every level of the tree (timeout: name who is missing)
        publish   round.json closed (if opened there), merged-<token>.json, older files removed
    """

    def __init__(self, me: Member, mem: LeaderMemory, announced: Round | None, groups: int) -> None:
        self.me, self.mem = me, mem
        self.start = now()
        self.deadline = self.start + me.timeout_s
        self.announced, self.groups = announced, groups

    def run(self, local_state: dict[str, Any]) -> Steps[tuple[dict[str, Any], Round]]:
        rnd, via_file = self.open()
        try:
            tree = self.me.tree(rnd.writers)
            try:
                top = yield from Gatherer(self.me, rnd, 0, self.deadline, watch_moved=False, waits=self.mem.parts).run(leaf(local_state, rnd), tree.depth)
            except PartsMissing as m:
                acc = yield from self.settle(rnd, examine(self.me, rnd, m, 0, tree.depth))
                head = f"checkpoint aggregation timed out after {self.me.timeout_s:g}s in {self.me.folder.path}"
                raise AggregationError(describe(self.me, rnd, acc, head)) from None
            if tree.depth == 0:  # the leader alone writes: its own state, as every merge leaves it
                own = top.lanes if top.lanes is not None else parse_lanes(top.state)
                state, lanes = merge_parsed([top.state], [own], world_size=self.me.world_size, labels=["global rank 0"])
                top = Subtree(state, lanes, top.strides)
            state_json, following = self.finish(rnd, top)
            self.publish(rnd, via_file, state_json, following)
        except BaseException:
            self.mem.unpublished.append(rnd.token)
            raise
        return json.loads(state_json), following

    def settle(self, rnd: Round, acc: Account) -> Steps[Account]:
        """Merging writers that never finished may still publish who never came below them: a merging writer
        gives up before the leader by the time its account takes to come up (``account.deadline``), as it
        reckons from its own call, which may come later than the leader's. Their parts are looked at for a
        while longer (a quarter of the timeout, at most ``SETTLE_S``); those that come name the ranks instead."""
        d, w = self.me.folder, rnd.writers
        until = now() + min(self.me.timeout_s / 4, SETTLE_S)
        while acc.stuck and now() < until:
            yield pause(d.pacing.merge_max_s)
            blobs = d.get_many([part_file(w.rank_of(c)) for _, c in acc.stuck])
            came = {(lv, c): account_of(blobs.get(part_file(w.rank_of(c))), d, rnd, lv, c) for lv, c in acc.stuck}
            for node, a in came.items():
                if a is not None:
                    acc = Account(acc.absent, [s for s in acc.stuck if s != node], acc.notes).join(a)
        return acc

    def open(self) -> tuple[Round, bool]:
        d, mem = self.me.folder, self.mem
        if self.announced is not None:
            mem.number = self.announced.number
            return self.announced, False
        first = not mem.started
        number, took_before = mem.number + 1, None
        if first:  # an earlier launch's round.json: its round may have readers of this launch waiting in it
            old = decode_round(d.get(ROUND_FILE), self.me.world_size)  # None unless of this world size
            if old is not None:
                number, took_before = old.round.number + 1, old.took  # closed: what it took; open: what it expected
                if old.open:
                    mem.unpublished.append(old.round.token)
        rnd = Round(new_token(), number, Writers(self.me.world_size, self.groups, None))
        mem.number = number
        d.put(ROUND_FILE, encode_round(rnd, True, took_before))
        for token in mem.unpublished:
            d.put(merged_file(token), encode_moved(token, rnd))
        mem.moved += mem.unpublished
        mem.unpublished = []
        if first:
            self.clean_up(rnd)
            mem.started = True
        return rnd, True

    def clean_up(self, rnd: Round) -> None:
        """Remove what earlier launches left, after opening the round (so that nobody waits for it).

        Parts of ranks of this world size are overwritten by this round; temporary
        files are other ranks' writes in flight (a crashed writer's are small).
        """
        keep = {ROUND_FILE, merged_file(rnd.token), *(merged_file(t) for t in self.mem.moved)}
        old = []
        for n in self.me.folder.names():
            r = rank_of_part(n)
            if n in keep or n.startswith(TMP_PREFIX) or (r is not None and r < self.me.world_size):
                continue
            old.append(n)
        self.me.folder.remove(sorted(old))

    def finish(self, rnd: Round, top: Subtree) -> tuple[bytes, Round]:
        """The merged state (every lane covered) and the next round, announced in it."""
        state = top.state
        C = state["canonical_replicas"]
        uncovered = [lane for lane in range(C) if str(lane) not in state["lanes"]]
        if uncovered:
            raise AggregationError(
                f"the {self.me.world_size} pipeline(s) of this checkpoint cover no lane(s) {uncovered} of canonical_replicas={C}: "
                "world_size must count a pipeline of every data-parallel group"
            )
        writers = rnd.writers
        if writers.stride is None:  # every rank wrote: from now on one per dp group, if a stride fits every rank
            fits = top.strides["candidates"] if top.strides and top.strides["groups"] == self.groups else []
            writers = Writers(self.me.world_size, self.groups, max(fits) if fits else None)
        return canonical_json(state).encode(), Round(new_token(), rnd.number + 1, writers)

    def publish(self, rnd: Round, via_file: bool, state_json: bytes, following: Round) -> None:
        d, mem = self.me.folder, self.mem
        if via_file:  # closed before the merged file exists: a new launch's rank that reads "open" knows none exists yet
            d.put(ROUND_FILE, encode_round(rnd, False, took=now() - self.start))
        d.put(merged_file(rnd.token), encode_merged(rnd, state_json, following, now() - self.start))
        # Every reader of an older round has moved to this one (every rank wrote in it), or read its
        # merged file; the last two merged files stay for readers that are a round behind.
        old = [t for t in mem.moved if t != rnd.token]
        if len(mem.published) == mem.published.maxlen:
            old.append(mem.published[0])
        d.remove([merged_file(t) for t in old])
        mem.moved = []
        mem.published.append(rnd.token)
