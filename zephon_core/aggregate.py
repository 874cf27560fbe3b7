"""Merging the progress of all ranks into one checkpoint, through files only.

Every pipeline counted in ``world_size`` calls ``checkpoint()`` at the same
step. They meet in ``<aggregate_dir>/<run_id>/`` (a local or shared directory
or an object-store prefix, through fsspec):

1. the leader (``global_rank`` 0) removes files of earlier rounds and of
   crashed attempts, then publishes ``round.json`` with a fresh random token;
2. each follower waits for a round token it has not used yet and writes
   ``state-<token>-<rank>.json``: its own lanes and a fresh random nonce;
3. the leader waits for every rank's file (up to ``aggregate_timeout_s``,
   then fails naming the missing ranks), merges them — data-parallel peers
   must agree on every lane — and publishes ``merged-<token>.json`` with the
   nonce of every state it merged;
4. followers read it, check that it names their own nonce (so a merged file
   left by a crashed or earlier launch is never taken for this round's) and
   that it carries their lanes unchanged.

Every file is published atomically (rename on a filesystem, a single PUT on
an object store), so a reader never sees half of one. A follower that joined
a stale round (left by a crashed attempt) moves to the leader's new token.
The leader keeps the previous round's merged file until the next round, so a
slow follower always finds it.
"""

from __future__ import annotations

import json
import os
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


def _now() -> float:
    return time.monotonic()


class _Dir:
    """The run's folder, with atomic publication and uncached listing."""

    def __init__(self, aggregate_dir: str, run_id: str, storage_options: dict[str, Any]) -> None:
        fs, _, paths = fsspec.get_fs_token_paths(aggregate_dir, storage_options=storage_options)
        self.fs = fs
        self.local = is_local(fs)
        self.path = paths[0].rstrip("/") + "/" + run_id
        self.poll_s, self.poll_max_s = (0.005, 0.05) if self.local else (0.02, 0.25)
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
        self.world_size = world_size
        self.rank = global_rank
        self.timeout_s = timeout_s
        self.last_token: str | None = None
        self.rounds = 0

    def checkpoint(self, local_state: dict[str, Any]) -> dict[str, Any]:
        self.rounds += 1
        merged = self._lead(local_state) if self.rank == 0 else self._follow(local_state)
        return merged

    # -- leader ---------------------------------------------------------------
    def _lead(self, local_state: dict[str, Any]) -> dict[str, Any]:
        d = self.dir
        keep = {f"merged-{self.last_token}.json"} if self.last_token else set()
        # Temporary files are other ranks' writes in flight; a crashed writer's are tiny.
        d.remove([n for n in d.names() if n not in keep and not n.startswith(TMP_PREFIX)])
        token = uuid.uuid4().hex
        d.write(ROUND_FILE, {"token": token, "round": self.rounds, "world_size": self.world_size})
        expected = {r: f"state-{token}-{r:05d}.json" for r in range(1, self.world_size)}
        states: dict[int, dict[str, Any]] = {0: local_state}
        deadline = _now() + self.timeout_s
        delay = d.poll_s
        nonces: dict[int, str] = {}
        while True:
            present = set(d.names())
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
            delay = min(delay * 1.5, d.poll_max_s)
        order = sorted(states)
        merged = merge_states([states[r] for r in order], world_size=self.world_size, labels=[f"rank {r}" for r in order])
        C = merged["canonical_replicas"]
        uncovered = [lane for lane in range(C) if str(lane) not in merged["lanes"]]
        if uncovered:
            raise AggregationError(
                f"the {self.world_size} pipeline(s) of this checkpoint cover no lane(s) {uncovered} of canonical_replicas={C}: "
                "world_size must count a pipeline of every data-parallel group"
            )
        d.write(f"merged-{token}.json", {"participants": {str(r): n for r, n in nonces.items()}, "state": merged})
        if self.last_token:
            d.remove([f"merged-{self.last_token}.json"])
        d.remove(list(expected.values()))
        self.last_token = token
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
        token: str | None = None
        stale: set[str] = set()
        nonce = uuid.uuid4().hex
        delay = d.poll_s
        while True:
            # The merged file of the round this rank joined comes first: the leader
            # opens its next round only after publishing it, so a newer round token
            # never means this rank's round was lost.
            if token is not None:
                published = d.read(f"merged-{token}.json")
                if published is not None:
                    where = d.file(f"merged-{token}.json")
                    if not isinstance(published, dict) or set(published) != {"participants", "state"}:
                        raise AggregationError(f"{where}: not a Zephon merged state (expected fields participants and state)")
                    if published["participants"].get(str(self.rank)) != nonce:
                        # Published before this rank joined: a round of a crashed or earlier
                        # launch. Wait for the leader's round instead.
                        stale.add(token)
                        token = None
                    else:
                        self._check_merged(published["state"], local_state, where)
                        self.last_token = token
                        return published["state"]
            rnd = d.read(ROUND_FILE)
            current = rnd.get("token") if isinstance(rnd, dict) else None
            if current and current != self.last_token and current != token and current not in stale:
                if token is not None and d.read(f"merged-{token}.json") is not None:
                    continue  # published between the two reads: take it on the next pass
                token = current  # (re)join the newest round
                d.write(f"state-{token}-{self.rank:05d}.json", {"nonce": nonce, "state": local_state})
                # The leader may wait for slow ranks for its whole timeout; allow for it.
                deadline = max(deadline, _now() + self.timeout_s + 5.0)
                continue
            if _now() > deadline:
                if token is None:
                    raise AggregationError(
                        f"checkpoint aggregation timed out after {self.timeout_s:g}s: global rank {self.rank} waited for the leader "
                        f"(global_rank 0) to open a round in {d.path}; did rank 0 call checkpoint()?"
                    )
                raise AggregationError(
                    f"checkpoint aggregation timed out: global rank {self.rank} wrote its state but the leader published no merged "
                    f"state in {d.path}; see the leader's error"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, d.poll_max_s)

    def _check_merged(self, merged: Any, local_state: dict[str, Any], where: str) -> None:
        try:
            lanes = parse_lanes(merged)
            verify_checksum(merged)
        except StateError as e:
            raise AggregationError(f"{where}: {e}") from None
        mine = parse_lanes(local_state)
        if merged["fingerprint"] != local_state["fingerprint"] or any(lanes.get(lane) != ls for lane, ls in mine.items()):
            raise AggregationError(f"{where}: the merged state does not carry global rank {self.rank}'s progress unchanged")
