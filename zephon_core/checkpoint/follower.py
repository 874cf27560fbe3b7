"""A rank's part in one round when it is not the leader."""

from __future__ import annotations

import collections
from typing import Any, NoReturn

from zephon_core.checkpoint import account
from zephon_core.checkpoint.account import PartsMissing, describe, examine, span_label
from zephon_core.checkpoint.gather import JITTER, Gatherer, Member, PartWaits, RoundReplaced, Steps, leaf, now, pause
from zephon_core.checkpoint.names import ROUND_FILE, merged_file, part_file
from zephon_core.checkpoint.records import Merged, Moved, Round, decode_merged, decode_round, encode_part
from zephon_core.checkpoint.tree import Writers
from zephon_core.errors import AggregationError

#: A rank waits this much longer than the leader, which may wait for a slow rank for its whole timeout.
GRACE_S = 5.0


class Expectation:
    """When the merged state should appear: how long the leader took in its last rounds with as many writers.

    Only timing. Ranks of one checkpoint call it at about the same time (a training
    step's collective just ended), so a rank first looks about that long after its
    own call. The leader's work depends on how many write (the tree's size), not on
    who: a launch's first round (every rank writes) tells when the next ones are due
    where every rank is its own dp group. With nothing to go by (a launch's first
    round, a change in the number of writers) a rank waits for ``first_guess``.
    """

    def __init__(self) -> None:
        self.slots: int | None = None
        self.took: collections.deque[float] = collections.deque(maxlen=3)
        self.parts = PartWaits()  # a merging writer's: when the parts of each level came

    def first_look(self, writers: Writers) -> float | None:
        # The quickest of the last rounds: one slow round (a late rank) does not delay the next ones.
        return min(self.took) if self.took and writers.slots == self.slots else None

    def learn(self, writers: Writers, took: float) -> None:
        if writers.slots != self.slots:
            self.slots = writers.slots
            self.took.clear()
        self.took.append(took)

    @staticmethod
    def first_guess(me: Member, writers: Writers, write_s: float) -> float:
        """A round with nothing to go by.

        Each writer's part costs the shared folder or store some time (``Pacing.per_writer_s``
        each: a metadata server or a prefix serving a few thousand writes a second). On an
        object store each level of the tree costs a merging writer a read of its parts and
        a write: about twice as long as this rank's own write took (``write_s``: the
        store's latency, or its queue when it is busy), once more for the merged state. On
        a folder a write takes microseconds, and one that took long says that this process
        was not scheduled, not when the leader will be done. Never sooner than
        ``Pacing.guess_floor_s``.
        """
        p = me.folder.pacing
        per_level = 0.0 if me.folder.local else 2 * (me.tree(writers).depth + 1) * write_s
        return max(writers.slots * p.per_writer_s, per_level, p.guess_floor_s)


class FollowerRound:
    """One checkpoint of a rank other than the leader::

        find        the round the last merged state announced or, at a launch's first
                    checkpoint, the one round.json names as open
        contribute  if this rank writes in it: merge the nodes it owns, write part-<rank>.json
        wait        for merged-<token>.json: the merged state, or a note that sends it to
                    the round that replaced this one (then contribute there)
        take        check that the merged state carries this rank's lanes unchanged
    """

    def __init__(self, me: Member, local_state: dict[str, Any], known: Round | None, expect: Expectation, failed_in: bool = False) -> None:
        self.me, self.local_state, self.expect = me, local_state, expect
        self.current = known  # the round this rank is in; kept by the Aggregator when the checkpoint fails
        # The last checkpoint failed in ``known``: it is over (the leader failed it too, or will), so a retry only
        # waits there for the note that sends it on, instead of merging anew what other ranks left in it.
        self.failed_in = failed_in
        self.called = now()
        self.write_s = 0.0  # how long writing this rank's part took (timing only)
        self.took_before: float | None = None  # round.json's: the last launch's first round of this world size took that long
        self.deadline = self.called + me.timeout_s + GRACE_S

    def run(self) -> Steps[tuple[dict[str, Any], Round]]:
        rnd = self.current or (yield from self.find())
        while True:
            self.current = rnd
            self.deadline = max(self.deadline, now() + self.me.timeout_s + GRACE_S)
            try:
                if not self.failed_in:
                    yield from self.contribute(rnd)
                self.failed_in = False
                outcome = yield from self.wait(rnd)
            except RoundReplaced as e:  # while merging the parts below it
                rnd = e.to
                continue
            if isinstance(outcome, Moved):
                rnd = outcome.to
                continue
            self.take(rnd, outcome.state)
            self.expect.learn(rnd.writers, outcome.took)
            return outcome.state, outcome.following

    def find(self) -> Steps[Round]:
        d = self.me.folder
        delay = d.pacing.again_s
        # The leader opens the round when it calls, as this rank does: a look at once would mostly come too early;
        # one that misses it means the leader calls late, by an unknown amount: twice as long each time.
        yield pause(d.pacing.again_s) + JITTER.uniform(0.0, self.me.world_size / d.pacing.follow_budget)
        while True:
            rf = decode_round(d.get(ROUND_FILE), self.me.world_size)
            if rf is not None and rf.open:  # a closed one is an earlier launch's (this launch's first round needs this rank)
                self.took_before = rf.took
                return rf.round
            if now() > self.deadline:
                raise AggregationError(
                    f"checkpoint aggregation timed out after {self.me.timeout_s:g}s: global rank {self.me.rank} waited for the leader "
                    f"(global_rank 0) to open a round in {d.path}; did rank 0 call checkpoint()?"
                )
            yield pause(delay)
            delay = self.next_delay(delay, 2.0)

    def next_delay(self, delay: float, growth: float) -> float:
        p = self.me.folder.pacing
        least = self.me.world_size / p.follow_budget
        return max(least, min(delay * growth, max(p.follow_max_s, least)))

    def contribute(self, rnd: Round) -> Steps[None]:
        w, me, d = rnd.writers, self.me, self.me.folder
        slot = w.slot_of(me.rank)
        if slot is None:  # another rank of this dp group writes for it
            return None
        tree = me.tree(w)
        top = tree.top(slot)
        own = leaf(self.local_state, rnd)
        if top > 0:
            # It gives up before the leader does (as it reckons the leader's deadline): its account reaches the leader.
            deadline = account.deadline(me, tree, top, self.deadline - GRACE_S)
            gatherer = Gatherer(me, rnd, slot, deadline, watch_moved=True, waits=self.expect.parts)
            try:
                own = yield from gatherer.run(own, top)
            except PartsMissing as m:
                acc = examine(me, rnd, m, slot, top)
                head = (f"checkpoint aggregation timed out after {me.timeout_s:g}s in {d.path}: global rank {me.rank}, "
                        f"merging the parts of {span_label(w, top, slot, w.slots, me.fan_in)}, found")
                self.fail(rnd, top, slot, describe(me, rnd, acc, head), acc.to_json())
            except AggregationError as e:
                self.fail(rnd, top, slot, str(e))
        t = now()
        d.write(part_file(me.rank), encode_part(rnd, top, slot, own.state, own.strides))
        self.write_s = now() - t

    def fail(self, rnd: Round, level: int, slot: int, message: str, acc: dict[str, Any] | None = None) -> NoReturn:
        """Tell the writer above (and so the leader) why this node cannot be merged (who never came: ``acc``)."""
        part = encode_part(rnd, level, slot, None, None, error=message, account=acc)
        self.me.folder.write(part_file(self.me.rank), part)
        raise AggregationError(message)

    def wait(self, rnd: Round) -> Steps[Merged | Moved]:
        d, name = self.me.folder, merged_file(rnd.token)
        due = self.expect.first_look(rnd.writers)
        # All ranks look within ``spread`` seconds of when the merged state is due, then again at least that
        # far apart (``Pacing.follow_budget``); at a launch's first round when the last launch's took (round.json),
        # and with nothing to go by, at a guess. After a miss the round is late
        # by an unknown amount: pauses of the time it was due, then twice as long each time (a few looks, however late).
        spread = self.me.world_size / d.pacing.follow_budget
        if due is None:
            # Neither the last launch's figure nor a guess delays the first look by more than a quarter of the
            # timeout: one slow launch (a rank that came late) delays only the next, whose own time (its leader's,
            # not its ranks') is what the one after goes by.
            before = self.took_before if rnd.writers.stride is None else None
            due = min(Expectation.first_guess(self.me, rnd.writers, self.write_s) if before is None else before, self.me.timeout_s / 4)
        delay, growth = max(d.pacing.again_s, due, spread), 2.0
        yield max(0.0, due - (now() - self.called)) + JITTER.uniform(0.0, spread)
        while True:
            look = now()
            data = d.get(name)
            if data is not None:
                return decode_merged(data, d.file(name), rnd.token, self.me.world_size)
            if look > self.deadline:
                raise AggregationError(
                    f"checkpoint aggregation timed out: global rank {self.me.rank} contributed to round {rnd.token} but the leader "
                    f"published no merged state in {d.path}; see the leader's error"
                )
            yield pause(min(delay, self.deadline - look + 0.01))
            delay = self.next_delay(delay, growth)

    def take(self, rnd: Round, state: dict[str, Any]) -> None:
        """The merged state must carry this rank's own lanes exactly: a representative stands for its peers only if they agree."""
        mine, where = self.local_state, self.me.folder.file(merged_file(rnd.token))
        lanes: dict[str, Any] = state["lanes"] if isinstance(state.get("lanes"), dict) else {}
        if state.get("fingerprint") != mine["fingerprint"] or state.get("canonical_replicas") != mine["canonical_replicas"]:
            raise AggregationError(f"{where}: the merged state is of another data definition than global rank {self.me.rank}'s")
        for lane, ls in sorted(mine["lanes"].items(), key=lambda kv: int(kv[0])):
            if lanes.get(lane) != ls:
                topo, w = mine["topology"], rnd.writers
                g = topo.get("dp_group_id")
                by = w.who(g) if w.stride is not None and isinstance(g, int) and g < w.groups else "the other ranks"
                raise AggregationError(
                    f"{where}: the merged state does not carry global rank {self.me.rank}'s progress unchanged: lane {lane} is "
                    f"{lanes.get(lane)} there (from {by}) and {ls} here; the ranks of dp group {g} did not checkpoint at the same step"
                )
