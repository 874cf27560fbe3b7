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
import os
import random
import re
import tempfile
import time
import uuid
from typing import Any

import fsspec

from zephon_core.errors import AggregationError, StateError
from zephon_core.sources.base import is_local
from zephon_core.state import canonical_json, merge_states, parse_lanes, verify_checksum

ROUND_FILE = "round.json"
TMP_PREFIX = ".tmp-"
_TOKEN = re.compile(r"[0-9a-f]{32}")


def _now() -> float:
    return time.monotonic()


class _Dir:
    """The run's folder, with atomic publication and uncached listing."""

    def __init__(self, aggregate_dir: str, run_id: str, storage_options: dict[str, Any]) -> None:
        fs, _, paths = fsspec.get_fs_token_paths(aggregate_dir, storage_options=storage_options)
        self.fs = fs
        self.local = is_local(fs)
        self.path = paths[0].rstrip("/") + "/" + run_id
        # Polling (seconds): first and longest sleep of the leader and of followers, and how often a
        # follower that joined a round re-reads round.json. A folder is cheap to poll; on an object
        # store every poll is a request, and followers (world_size - 1 of them) poll less often
        # (Aggregator stretches follow_poll_max_s with world_size there).
        if self.local:
            self.poll_s, self.lead_poll_max_s, self.follow_poll_max_s, self.round_recheck_s = 0.005, 0.05, 0.05, 0.0
        else:
            self.poll_s, self.lead_poll_max_s, self.follow_poll_max_s, self.round_recheck_s = 0.02, 0.1, 0.25, 1.0
        try:
            fs.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise AggregationError(f"cannot create aggregate folder {self.path}: {e}") from None

    def file(self, name: str) -> str:
        return f"{self.path}/{name}"

    def write(self, name: str, value: Any) -> None:
        data = canonical_json(value).encode()
        target = self.file(name)
        try:
            if self.local:
                fd, tmp = tempfile.mkstemp(dir=self.path, prefix=TMP_PREFIX)
                try:
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    os.chmod(tmp, 0o644)
                    os.replace(tmp, target)
                except BaseException:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                    raise
            else:
                self.fs.pipe_file(target, data)
        except OSError as e:
            raise AggregationError(f"cannot write {target}: {e}") from None

    def read(self, name: str) -> Any | None:
        """The parsed file, or None when it does not exist (yet)."""
        target = self.file(name)
        try:
            data = self.fs.cat_file(target)
        except FileNotFoundError:
            return None
        try:
            return json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise AggregationError(f"{target} is not valid JSON ({e}); was it written by something else?") from None

    def read_many(self, names: list[str]) -> dict[str, Any]:
        """Several files at once (concurrently on an object store); missing ones are left out."""
        if self.local or len(names) < 2:
            found = {n: self.read(n) for n in names}
            return {n: v for n, v in found.items() if v is not None}
        by_path = {self.file(n): n for n in names}
        raw = self.fs.cat(list(by_path), on_error="omit")
        out = {}
        for path, data in raw.items():
            name = by_path.get(path) or path.rstrip("/").rsplit("/", 1)[-1]
            try:
                out[name] = json.loads(data)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise AggregationError(f"{self.file(name)} is not valid JSON ({e}); was it written by something else?") from None
        return out

    def names(self) -> list[str]:
        self.fs.invalidate_cache(self.path)
        try:
            return [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.path, detail=False)]
        except FileNotFoundError:
            return []

    def remove(self, names: list[str]) -> None:
        if names and not self.local:
            try:  # one bulk request (S3 DeleteObjects) instead of one per file
                self.fs.rm([self.file(n) for n in names])
                return
            except (FileNotFoundError, OSError):
                pass
        for n in names:
            try:
                self.fs.rm_file(self.file(n))
            except (FileNotFoundError, OSError):
                pass


class Aggregator:
    """One pipeline's side of the protocol; it remembers the last round it took part in."""

    def __init__(self, aggregate_dir: str, run_id: str, world_size: int, global_rank: int, timeout_s: float, storage_options: dict[str, Any]) -> None:
        self.dir = _Dir(aggregate_dir, run_id, storage_options)
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
        d = self.dir
        deadline = _now() + self.timeout_s
        stale: set[str] = set()
        nonce = uuid.uuid4().hex
        # The round the leader announced in the last merged file, once (see the module docstring);
        # "opened": round.json named the round this rank is in.
        token, self.next_token = self.next_token, None
        opened, announced = False, token is not None
        if token is not None:
            joined, deadline = self._join(token, nonce, local_state)
        round_read = _now()  # when round.json was last read (for an announced round: the announcement)
        first: float | None = self._first_wait() if token is not None else None
        delay = d.poll_s
        missed = None  # when this rank last looked for its round's merged file in vain
        while True:
            if first is not None:  # just joined: the merged file cannot be there yet
                time.sleep(first)
                first, delay = None, d.poll_s
            if token is not None:
                # The merged file of the round this rank joined comes first: the leader
                # opens its next round only after publishing it, so a newer round token
                # never means this rank's round was lost.
                look = _now()
                published = d.read(f"merged-{token}.json")
                if published is not None:
                    where = d.file(f"merged-{token}.json")
                    if not isinstance(published, dict) or not {"participants", "state"} <= set(published) <= {"participants", "state", "next"} \
                            or not isinstance(published["participants"], dict):
                        raise AggregationError(f"{where}: not a Zephon merged state (expected fields participants, state and next)")
                    if published["participants"].get(str(self.rank)) != nonce:
                        # Published before this rank joined: a round of a crashed or earlier
                        # launch. Wait for the leader's round instead.
                        stale.add(token)
                        token = None
                    else:
                        self._check_merged(published["state"], local_state, where)
                        following = published.get("next")
                        found = _now() - joined
                        # It appeared between the last look in vain and now; found at the first look: at most now
                        # (perhaps much earlier: aim lower next time). A round joined through round.json (the
                        # first of a launch) also waited for every rank's first store request, which is slow.
                        wait = (found + missed - joined) / 2 if missed is not None else 0.6 * found
                        self.waits.append(wait if announced else wait / 2)
                        self.last_token = token
                        self.next_token = following if isinstance(following, str) and _TOKEN.fullmatch(following) and following != token else None
                        return published["state"]
                missed = look
            # round.json only tells a rank in a round that its round is stale: on an object
            # store, a rank in a round reads it once in a while only.
            if token is None or _now() - round_read >= d.round_recheck_s or (_now() > deadline and not opened):
                round_read = _now()
                rnd = d.read(ROUND_FILE)
                current = rnd.get("token") if isinstance(rnd, dict) else None
                opened = opened or (token is not None and current == token)
                if current and current != self.last_token and current != token and current not in stale:
                    if token is not None and d.read(f"merged-{token}.json") is not None:
                        continue  # published between the two reads: take it on the next pass
                    token, opened, announced, missed = current, True, False, None  # (re)join the newest round
                    joined, deadline = self._join(token, nonce, local_state, deadline)
                    first = self._first_wait()
                    continue
            if _now() > deadline:
                if token is None or not opened:
                    raise AggregationError(
                        f"checkpoint aggregation timed out after {self.timeout_s:g}s: global rank {self.rank} waited for the leader "
                        f"(global_rank 0) to open a round in {d.path}; did rank 0 call checkpoint()?"
                    )
                raise AggregationError(
                    f"checkpoint aggregation timed out: global rank {self.rank} wrote its state but the leader published no merged "
                    f"state in {d.path}; see the leader's error"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, d.follow_poll_max_s)

    def _join(self, token: str, nonce: str, local_state: dict[str, Any], deadline: float = 0.0) -> tuple[float, float]:
        """Write this rank's state for round ``token``; returns (when, the new deadline)."""
        self.dir.write(f"state-{token}-{self.rank:05d}.json", {"nonce": nonce, "state": local_state})
        now = _now()
        # The leader may wait for slow ranks for its whole timeout; allow for it.
        return now, max(deadline, now + self.timeout_s + 5.0)

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
