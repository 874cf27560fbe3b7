"""Merging the progress of all ranks into one checkpoint, through files only.

Every pipeline counted in ``world_size`` calls ``checkpoint()`` at the same
step. They meet in ``<aggregate_dir>/<run_id>/`` (a local or shared directory
or an object-store prefix, through fsspec):

1. the leader (``global_rank`` 0) publishes ``round.json`` with a fresh
   random token, then removes files of earlier rounds and of crashed attempts
   (never one of this round's);
2. each follower waits for a round token it has not used yet and writes
   ``state-<token>-<rank>.json``: its own lanes and a fresh random nonce;
3. the leader waits for every rank's file (up to ``aggregate_timeout_s``,
   then fails naming the missing ranks), merges them — data-parallel peers
   must agree on every lane — and publishes ``merged-<token>.json`` with the
   nonce of every state it merged and the fresh random token of its next
   round; then it removes this round's state files;
4. followers read it, check that it names their own nonce (so a merged file
   left by a crashed or earlier launch is never taken for this round's) and
   that it carries their lanes unchanged.

Every file is published atomically (rename on a filesystem, a single PUT on
an object store), so a reader never sees half of one. A follower that joined
a stale round (left by a crashed attempt) moves to the leader's new token.
The leader keeps the previous round's merged file until the next round, so a
slow follower always finds it.

Each token is used for one round at most. A follower that took round k's merged
state already knows round k+1's token (the leader announced it), so at the next
checkpoint it writes its state at once instead of polling ``round.json`` first;
the leader opens that round with that token (or, after a failed round, a fresh
one, which a follower waiting in vain then finds in ``round.json``).

Every poll of an object store is a request that costs the store and the caller,
so followers there poll less often: after writing their state they sleep a little
less than the merged file took to appear in their quickest recent round (at most
0.25 s + 10 ms per rank) before their first look, and look at ``round.json`` (only
needed to leave a stale round) once a second while they wait. Timing only: no
step above depends on it.
"""

from __future__ import annotations

import collections
import json
import random
import re
import time
import uuid
from typing import Any

from zephon_core.checkpoint.folder import TMP_PREFIX, AggregateFolder
from zephon_core.checkpoint.merge import merge_states
from zephon_core.checkpoint.state import canonical_json, parse_lanes, verify_checksum
from zephon_core.errors import AggregationError, StateError

ROUND_FILE = "round.json"
_TOKEN = re.compile(r"[0-9a-f]{32}")


def _now() -> float:
    return time.monotonic()


class Aggregator:
    """One pipeline's side of the protocol; it remembers the last round it took part in."""

    def __init__(self, aggregate_dir: str, run_id: str, world_size: int, global_rank: int, timeout_s: float, storage_options: dict[str, Any]) -> None:
        self.dir = AggregateFolder(aggregate_dir, run_id, storage_options)
        if not self.dir.local:  # +5 ms a rank, to 1 s: all followers together poll < 200 times a second up to 150 ranks
            self.dir.follow_poll_max_s = min(1.0, self.dir.follow_poll_max_s + 0.005 * world_size)
        self.world_size = world_size
        self.rank = global_rank
        self.timeout_s = timeout_s
        self.last_token: str | None = None
        self.next_token: str | None = None  # announced in the last merged file: the token of the next round
        # follower: how long, from writing its state, the merged file took to appear (estimates, last rounds)
        self.waits: collections.deque[float] = collections.deque(maxlen=3)
        self.rounds = 0

    def checkpoint(self, local_state: dict[str, Any]) -> dict[str, Any]:
        self.rounds += 1
        merged = self._lead(local_state) if self.rank == 0 else self._follow(local_state)
        return merged

    # -- leader ---------------------------------------------------------------
    def _lead(self, local_state: dict[str, Any]) -> dict[str, Any]:
        d = self.dir
        # The token announced to the followers, once: a failed round's is never reused.
        token, self.next_token = self.next_token or uuid.uuid4().hex, None
        d.write(ROUND_FILE, {"token": token, "round": self.rounds, "world_size": self.world_size})
        keep = {ROUND_FILE} | ({f"merged-{self.last_token}.json"} if self.last_token else set())
        expected = {r: f"state-{token}-{r:05d}.json" for r in range(1, self.world_size)}
        states: dict[int, dict[str, Any]] = {0: local_state}
        deadline = _now() + self.timeout_s
        delay = d.poll_s
        nonces: dict[int, str] = {}
        cleaned = False
        while True:
            present = set(d.names())
            if not cleaned:
                # Files of earlier rounds and crashed attempts, after opening the round (so followers need
                # not wait for it), from the first listing. Temporary files are other ranks' writes in
                # flight (a crashed writer's are tiny); this round's states may already be there.
                old = sorted(n for n in present if n not in keep and not n.startswith((TMP_PREFIX, f"state-{token}-")))
                if old:
                    d.remove(old)
                cleaned = True
            arrived = [name for r, name in expected.items() if r not in states and name in present]
            envelopes = d.read_many(arrived)
            for r, name in expected.items():
                if name in envelopes:
                    nonces[r], states[r] = self._check_peer(envelopes[name], r, d.file(name))
            missing = sorted(set(expected) - set(states))
            if not missing:
                break
            if _now() > deadline:
                raise AggregationError(
                    f"checkpoint aggregation timed out after {self.timeout_s:g}s in {d.path}: global rank(s) {missing} of "
                    f"world_size={self.world_size} did not call checkpoint(); every pipeline counted in world_size must call it at the same step"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, d.lead_poll_max_s)
        order = sorted(states)
        merged = merge_states([states[r] for r in order], world_size=self.world_size, labels=[f"rank {r}" for r in order])
        C = merged["canonical_replicas"]
        uncovered = [lane for lane in range(C) if str(lane) not in merged["lanes"]]
        if uncovered:
            raise AggregationError(
                f"the {self.world_size} pipeline(s) of this checkpoint cover no lane(s) {uncovered} of canonical_replicas={C}: "
                "world_size must count a pipeline of every data-parallel group"
            )
        following = uuid.uuid4().hex
        d.write(f"merged-{token}.json", {"participants": {str(r): n for r, n in nonces.items()}, "state": merged, "next": following})
        # One (bulk) request; followers are reading the merged file meanwhile.
        d.remove(([f"merged-{self.last_token}.json"] if self.last_token else []) + list(expected.values()))
        self.last_token, self.next_token = token, following
        return json.loads(canonical_json(merged))

    def _check_peer(self, envelope: Any, rank: int, where: str) -> tuple[str, dict[str, Any]]:
        if not isinstance(envelope, dict) or set(envelope) != {"nonce", "state"} or not isinstance(envelope["nonce"], str):
            raise AggregationError(f"{where}: not a Zephon rank state (expected fields nonce and state)")
        st = envelope["state"]
        try:
            parse_lanes(st)
            verify_checksum(st)
        except StateError as e:
            raise AggregationError(f"{where}: {e}") from None
        if st["topology"].get("global_rank") != rank:
            raise AggregationError(f"{where}: holds the state of global_rank={st['topology'].get('global_rank')}, expected {rank}")
        if st["topology"].get("world_size") != self.world_size:
            raise AggregationError(f"{where}: rank {rank} has world_size={st['topology'].get('world_size')}, the leader has {self.world_size}")
        return envelope["nonce"], st

    # -- follower -------------------------------------------------------------
    def _follow(self, local_state: dict[str, Any]) -> dict[str, Any]:
        """Hand this rank's state to the leader's round and return the merged state it publishes."""
        rnd = _FollowerRound(self, local_state)
        while True:
            rnd.settle()
            if rnd.token is not None:
                merged = rnd.take_merged()
                if merged is not None:
                    return merged
            if rnd.round_file_due() and rnd.follow_round_file():
                continue
            rnd.fail_if_late()
            rnd.pause()

    def _first_wait(self) -> float:
        """The first sleep after joining a round: the merged file cannot be there before the leader
        has every state. On an object store, a little less than it took in the quickest of the last
        rounds (jittered, so that the followers' looks spread out), at most 0.25 s + 10 ms per rank
        (a round it waited long for, for a slow rank, says little about the next); then short polls."""
        d = self.dir
        if d.local or not self.waits:
            return d.poll_s
        cap = min(0.25 + 0.01 * self.world_size, self.timeout_s / 4)
        return max(d.poll_s, min(min(self.waits) * random.uniform(0.8, 0.95), cap))

    def _check_merged(self, merged: Any, local_state: dict[str, Any], where: str) -> None:
        try:
            lanes = parse_lanes(merged)
            verify_checksum(merged)
        except StateError as e:
            raise AggregationError(f"{where}: {e}") from None
        mine = parse_lanes(local_state)
        if merged["fingerprint"] != local_state["fingerprint"] or any(lanes.get(lane) != ls for lane, ls in mine.items()):
            raise AggregationError(f"{where}: the merged state does not carry global rank {self.rank}'s progress unchanged")


class _FollowerRound:
    """One follower's part in one checkpoint: which round it is in, and what it has seen.

    A follower joins the round the last merged file announced (at once) or, when
    there is none, the one ``round.json`` names; it moves to a newer round when
    its own turns out stale (left by a crashed attempt or an earlier launch).
    """

    def __init__(self, agg: Aggregator, local_state: dict[str, Any]) -> None:
        self.agg = agg
        self.envelope: dict[str, Any] = {"nonce": uuid.uuid4().hex, "state": local_state}  # what this rank writes
        self.deadline = _now() + agg.timeout_s
        self.stale: set[str] = set()  # round tokens whose merged file predates this rank's state
        self.token: str | None = None  # the round this rank wrote its state for
        self.opened = False  # round.json named this rank's round
        self.announced = False  # the round was announced by the last merged file
        self.joined = 0.0  # when this rank wrote its state
        self.missed: float | None = None  # when it last looked for the merged file in vain
        self.round_read = _now()  # when round.json was last read (or the announcement taken)
        self.delay = agg.dir.poll_s
        self.first: float | None = None  # the sleep before the first look, just after joining
        announced, agg.next_token = agg.next_token, None
        if announced is not None:
            self.join(announced, announced=True)

    def join(self, token: str, *, announced: bool) -> None:
        """Write this rank's state for round ``token``."""
        self.agg.dir.write(f"state-{token}-{self.agg.rank:05d}.json", self.envelope)
        self.token, self.announced, self.missed = token, announced, None
        self.joined = _now()
        # The leader may wait for slow ranks for its whole timeout; allow for it.
        self.deadline = max(self.deadline, self.joined + self.agg.timeout_s + 5.0)
        self.first = self.agg._first_wait()

    def settle(self) -> None:
        if self.first is not None:  # just joined: the merged file cannot be there yet
            time.sleep(self.first)
            self.first, self.delay = None, self.agg.dir.poll_s

    def take_merged(self) -> dict[str, Any] | None:
        """The merged state of this rank's round, if published; a stale round's file leaves the round."""
        assert self.token is not None
        d, agg = self.agg.dir, self.agg
        look = _now()
        name = f"merged-{self.token}.json"
        published = d.read(name)
        if published is not None:
            where = d.file(name)
            if not isinstance(published, dict) or not {"participants", "state"} <= set(published) <= {"participants", "state", "next"} \
                    or not isinstance(published["participants"], dict):
                raise AggregationError(f"{where}: not a Zephon merged state (expected fields participants, state and next)")
            if published["participants"].get(str(agg.rank)) == self.envelope["nonce"]:
                agg._check_merged(published["state"], self.envelope["state"], where)
                self._learn(published.get("next"), found=_now() - self.joined)
                return published["state"]
            # Published before this rank joined: a round of a crashed or earlier launch.
            # Wait for the leader's round instead.
            self.stale.add(self.token)
            self.token = None
        self.missed = look
        return None

    def _learn(self, following: Any, found: float) -> None:
        """Remember the round and the token it announced, and how long the merged file took."""
        agg = self.agg
        # It appeared between the last look in vain and now; found at the first look: at most now
        # (perhaps much earlier: aim lower next time). A round joined through round.json (the
        # first of a launch) also waited for every rank's first store request, which is slow.
        wait = (found + self.missed - self.joined) / 2 if self.missed is not None else 0.6 * found
        agg.waits.append(wait if self.announced else wait / 2)
        agg.last_token = self.token
        valid = isinstance(following, str) and _TOKEN.fullmatch(following) and following != self.token
        agg.next_token = following if valid else None

    def round_file_due(self) -> bool:
        # round.json only tells a rank in a round that its round is stale: on an object
        # store, a rank in a round reads it once in a while only.
        now = _now()
        return self.token is None or now - self.round_read >= self.agg.dir.round_recheck_s or (now > self.deadline and not self.opened)

    def follow_round_file(self) -> bool:
        """Read ``round.json``; True when it named a newer round, which this rank has now joined."""
        d, agg = self.agg.dir, self.agg
        self.round_read = _now()
        rnd = d.read(ROUND_FILE)
        current = rnd.get("token") if isinstance(rnd, dict) else None
        self.opened = self.opened or (self.token is not None and current == self.token)
        if not current or current in (agg.last_token, self.token) or current in self.stale:
            return False
        if self.token is not None and d.read(f"merged-{self.token}.json") is not None:
            return True  # published between the two reads: take it on the next pass
        self.join(current, announced=False)
        self.opened = True
        return True

    def fail_if_late(self) -> None:
        if _now() <= self.deadline:
            return
        d = self.agg.dir
        if self.token is None or not self.opened:
            raise AggregationError(
                f"checkpoint aggregation timed out after {self.agg.timeout_s:g}s: global rank {self.agg.rank} waited for the leader "
                f"(global_rank 0) to open a round in {d.path}; did rank 0 call checkpoint()?"
            )
        raise AggregationError(
            f"checkpoint aggregation timed out: global rank {self.agg.rank} wrote its state but the leader published no merged "
            f"state in {d.path}; see the leader's error"
        )

    def pause(self) -> None:
        time.sleep(self.delay)
        self.delay = min(self.delay * 1.5, self.agg.dir.follow_poll_max_s)
