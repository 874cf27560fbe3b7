"""Merging the progress of all ranks into one checkpoint, through files only.

Every pipeline counted in ``world_size`` calls ``checkpoint()`` at the same
step. They meet in ``<aggregate_dir>/<run_id>/`` (a local or shared directory
or an object-store prefix, through fsspec; file names in ``names``).

**Who writes** (``tree.Writers``). At a round the leader opens without having
announced it (a launch's first checkpoint, a retry after a failed one) every
rank writes. The merged state of such a round announces the next round: its
token and, when the data-parallel groups of all ranks follow a stride ``I``
(group of global rank ``r`` = ``(r // I) % dp_degree``, as TorchTitan lays out
its TP/CP/PP peers), that from then on only global rank ``g * I`` writes for dp
group ``g``. Each rank decides from its own ranks whether it writes; a writer
whose identity does not match is refused, a peer whose lanes differ from its
representative's refuses the merged state, so neither is merged silently.

**One round** (``tree.Tree``: writers are slots; the writer of slot ``s`` merges
the nodes of the tree starting at ``s``, ``FAN_IN`` children each)::

    leader (slot 0)       writer of slot 16        writer of slot 17      non-writer
    ---------------       -------------------      -----------------      ----------
    open: round.json      (knows the token: announced,
    (if not announced)     or round.json "open")
          |                       |                        |
          |               merge slots 16..31  <---  part-17.json          (nothing to write)
          |                       |
    merge 0..15, 16.., ... <--- part-16.json
          |
    round.json "closed" (if opened there), then
    merged-<token>.json: state + next round  --->  every rank reads it, checks its own lanes, returns it

A writer that owns no node writes its own state; one that does writes the merge
of its highest node (one file per writer per round, ``part-<rank>.json``,
overwritten next round). A merging writer waits for the parts it merges a little
less than the leader does (one relay per level above it, ``account.deadline``),
then looks down its own subtree and writes who never came instead (``account``);
when the leader's own ``aggregate_timeout_s`` passes it looks down the tree, joins
those accounts (waiting a little longer for those not yet written) and names the
ranks that never wrote and the merging writers that never finished.

**Stale files.** Tokens are random and used once. A round.json left ``open`` by
an earlier launch names a round that was never published (the leader closes the
round file before it publishes); a new leader writes ``merged-<old token>.json``
as a note that sends that round's readers to its own. ``closed`` means the round
is over: a rank of a new launch waits for round.json to change. A part is taken
only with this round's token, so nothing of an earlier attempt is merged.

**Waiting.** Only merging writers look for parts, one missing part at a time,
first a little before that level's parts came in their last round
(``gather.PartWaits``). Every rank looks for the merged file when it is due (the
leader's duration of its last rounds with as many writers, in the merged file; at a
launch's first round a guess from the writers and the rank's own write time), all
ranks within ``world_size / follow_budget`` seconds of that, then after that long
again and twice as long each time (``folder.Pacing``, ``follower.Expectation``).
Timing only: no step above depends on it. A rank's part in a round is written as steps
(``Aggregator.steps``) that yield their pauses, so that one process can simulate
thousands of ranks (bench/goals/p4s_scale/aggregate_scale.py).
"""

from __future__ import annotations

import time
from typing import Any

from zephon_core.checkpoint import tree
from zephon_core.checkpoint.folder import AggregateFolder
from zephon_core.checkpoint.follower import Expectation, FollowerRound
from zephon_core.checkpoint.gather import Member, Steps
from zephon_core.checkpoint.leader import LeaderMemory, LeaderRound
from zephon_core.checkpoint.records import Round


class Aggregator:
    """One pipeline's side of the protocol; it remembers the round it takes part in next."""

    def __init__(self, aggregate_dir: str, run_id: str, world_size: int, global_rank: int, timeout_s: float,
                 storage_options: dict[str, Any], fan_in: int | None = None) -> None:
        fan_in = fan_in or tree.FAN_IN  # looked up now: tests of small worlds lower it for every rank of a run
        self.me = Member(AggregateFolder(aggregate_dir, run_id, storage_options), global_rank, world_size, timeout_s, fan_in)
        self.next: Round | None = None  # announced by the last merged state (or the round a failed checkpoint was in)
        self.failed = False  # the last checkpoint failed in ``next``
        self.expect = Expectation()
        self.leader = LeaderMemory()
        self.rounds = 0

    @property
    def dir(self) -> AggregateFolder:
        return self.me.folder

    def checkpoint(self, local_state: dict[str, Any]) -> dict[str, Any]:
        """This rank's part in one round; the merged state every rank returns."""
        steps = self.steps(local_state)
        try:
            while True:
                time.sleep(next(steps))
        except StopIteration as done:
            return done.value

    def steps(self, local_state: dict[str, Any]) -> Steps[dict[str, Any]]:
        """``checkpoint`` as steps: it yields how long to pause before each next step (see ``gather.Steps``)."""
        self.rounds += 1
        if self.me.rank == 0:
            try:
                G = local_state["topology"].get("dp_degree")
                groups = G if isinstance(G, int) and G >= 1 else self.me.world_size
                state, self.next = yield from LeaderRound(self.me, self.leader, self.next, groups).run(local_state)
            except BaseException:
                self.next = None  # a failed round's token is never used again: the next one is opened afresh
                raise
            return state
        follower = FollowerRound(self.me, local_state, self.next, self.expect, self.failed)
        try:
            state, self.next = yield from follower.run()
        except BaseException:
            # A retry waits where this one stopped, for the leader to send it on to its next round.
            self.next, self.failed = follower.current, follower.current is not None
            raise
        self.failed = False
        return state
