"""Faults during checkpoint aggregation, with real rank processes and real folders.

Every scenario ends in a clear error naming the problem, or in a correct
recovery: a new attempt with the same run_id restores the last merged state
and its rows, step by step, equal an uninterrupted run's (0 lost, 0
duplicated). Ranks are ``rank_worker.py`` processes; a fault is a SIGKILL or
a failing write injected in that process only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import relkit
from relkit import C, M, by_step, compare, rank_config, reference, run_ranks, write_json

#: Short leader timeout for attempts that are meant to fail (every rank is up
#: before the first checkpoint, see the worker's barrier).
FAIL_TIMEOUT = 2.0
OK_TIMEOUT = 90.0


def per_rank(steps: int, G: int) -> int:
    """Batches one group delivers in ``steps`` optimizer steps."""
    return steps * C * M // G


def group(configs_kw: dict, W: int, workdir: Path, **common) -> list[dict]:
    return [rank_config(workdir, world_size=W, rank=r, **common, **configs_kw.get(r, {})) for r in range(W)]


def reference_lanes(steps: int, seed: int = 7) -> dict:
    p = relkit.pipeline(seed, prefetch=0)
    it = iter(p)
    for _ in range(steps * C * M):
        next(it)
    lanes = p.local_state()["lanes"]
    p.close()
    return lanes


def recover(workdir: Path, agg: str, run_id: str, W: int, restore_state: dict, done_steps: int, total_steps: int,
            storage_options=None, tag="attempt2", seed: int = 7) -> tuple[list, dict]:
    """A fresh attempt with the same run_id: restore, run to ``total_steps``, checkpoint."""
    restore = write_json(workdir / f"{tag}-restore.json", restore_state)
    # The new leader goes first: followers wait until it has replaced the crashed
    # attempt's round (the follower-first orders have tests of their own).
    stale = relkit.round_token(agg, run_id, storage_options)
    gate = {"round": 0, "round_not": stale} if stale else None
    cfgs = [
        rank_config(workdir, agg=agg, run_id=run_id, world_size=W, rank=r, segments=[per_rank(total_steps - done_steps, W)],
                    restore=restore, timeout_s=OK_TIMEOUT, storage_options=storage_options, tag=tag, seed=seed,
                    gate=gate if r else None)
        for r in range(W)
    ]
    res = run_ranks(cfgs, timeout=150)
    assert all(r.returncode == 0 and r.error is None for r in res), res
    states = [r.states[-1] for r in res]
    assert all(s == states[0] for s in states), "ranks returned different merged states"
    return res, states[0]


def account(rel, name: str, first_rows: list, done_steps: int, second: list, total_steps: int, final_state: dict, seed: int = 7,
            outcome: str = "new attempt (same run_id) restores the last merged state; all ranks return the right merged state") -> None:
    """Committed rows = attempt 1 up to its last good checkpoint + attempt 2; compare with the reference."""
    rows = [rec for rec in first_rows if relkit.step_of(rec) < done_steps] + [rec for r in second for rec in r.rows]
    checked, lost, dup = compare(by_step(rows), reference(total_steps, seed))
    rel.case(name, outcome, samples=checked, lost=lost, duplicated=dup)
    assert (lost, dup) == (0, 0), f"{lost} rows lost, {dup} duplicated"
    assert final_state["lanes"] == reference_lanes(total_steps, seed)


@pytest.mark.parametrize("kind", ["kill_before_checkpoint", "kill_before_state_write", "kill_mid_state_write"])
def test_rank_killed_before_or_while_writing_its_state(tmp_path, rel, kind):
    agg, run_id, W = str(tmp_path / "agg"), f"job-{kind}", 2
    kw = {1: {"fault": {"kind": kind, "round": 1}}}
    cfgs = group(kw, W, tmp_path, agg=agg, run_id=run_id, segments=[per_rank(2, W), per_rank(2, W)], timeout_s=FAIL_TIMEOUT, tag="attempt1")
    res = run_ranks(cfgs, timeout=90)
    leader, victim = res
    assert victim.killed, victim
    assert leader.error and leader.error["type"] == "AggregationError", leader
    assert "global rank(s) [1]" in leader.error["message"] and "did not call checkpoint()" in leader.error["message"], leader.error
    assert len(leader.states) == 1 and victim.states == leader.states  # round 0 went through
    names = os.listdir(Path(agg) / run_id)
    round1 = relkit.merged_headers(agg, run_id)[1]["next"]["token"]  # announced by round 0's merged state
    assert "merged-" + round1 + ".json" not in names, "a round with a dead rank was published"
    if kind == "kill_mid_state_write":  # half of the part, in place: it names round 1 but is never taken
        assert relkit.part_token(agg, run_id, 1) == round1, names
        assert "an incomplete part of this round" in leader.error["message"], leader.error
    else:
        assert relkit.part_token(agg, run_id, 1) != round1, "the dead rank's part of round 1 exists"
    rel.case(f"rank killed ({kind.replace('kill_', '').replace('_', ' ')})",
             "leader: AggregationError naming global rank 1 as missing; a half-written part is never taken")
    second, final = recover(tmp_path, agg, run_id, W, leader.states[0], 2, 5)
    account(rel, f"rank killed ({kind.replace('kill_', '').replace('_', ' ')}): rows", leader.rows + victim.rows, 2, second, 5, final)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_leader_killed_after_merging_before_publishing(tmp_path, rel, where, request):
    run_id = f"job-leader-{uuid.uuid4().hex[:8]}"
    so = None
    if where == "s3":
        ep = request.getfixturevalue("s3_endpoint")
        agg, so = ep.url("reliability", "agg"), ep.storage_options
    else:
        agg = str(tmp_path / "agg")
    W = 2
    kw = {0: {"fault": {"kind": "kill_before_publish", "round": 1}}}
    cfgs = group(kw, W, tmp_path, agg=agg, run_id=run_id, segments=[per_rank(1, W), per_rank(2, W)], timeout_s=FAIL_TIMEOUT,
                 storage_options=so, tag="attempt1")
    res = run_ranks(cfgs, timeout=90)
    assert res[0].killed, res[0]
    follower = res[1]
    assert len(follower.states) == 1
    assert follower.error and follower.error["type"] == "AggregationError", follower
    assert "leader published no merged state" in follower.error["message"], follower.error
    # Resume on another topology (4 groups instead of 2) from the last published state.
    W2 = 4 if where == "local" else 2
    second, final = recover(tmp_path, agg, run_id, W2, follower.states[0], 1, 4, storage_options=so)
    rel.case(f"leader killed after merging, before publishing ({where})", "follower: AggregationError 'the leader published no merged state'")
    account(rel, f"leader killed before publishing ({where}): rows, resumed on {W2} groups", res[0].rows + res[1].rows, 1, second, 4, final)


def _leftovers(kind: str, tmp_path: Path, agg: str, run_id: str) -> tuple[dict | None, list]:
    """Attempt 1 of the stale-files scenario; returns (state to restore, committed rows).

    ``unpublished``/``published``: the leader dies at checkpoint 1 (a round announced by
    checkpoint 0's merged state; round.json is closed), before or after publishing it.
    ``first``: it dies at checkpoint 0 once it has read the follower's part, leaving round.json
    open with that part in it (then there is nothing to restore).
    """
    W = 2
    first = kind == "first"
    fault = {"kind": {"published": "kill_after_publish", "first": "kill_before_part_merge"}.get(kind, "kill_before_publish"), "round": 0 if first else 1}
    cfgs = group({0: {"fault": fault}}, W, tmp_path, agg=agg, run_id=run_id, segments=[per_rank(1, W)] * (1 if first else 2),
                 timeout_s=FAIL_TIMEOUT, tag="attempt1")
    pids = relkit.start_ranks(cfgs)
    leader = relkit.wait_ranks(pids[:1], cfgs[:1], 90)[0]
    assert leader.killed, leader
    if kind != "published":  # the whole job goes down with its leader
        os.kill(pids[1], signal.SIGKILL)
    res = [leader] + relkit.wait_ranks(pids[1:], cfgs[1:], 90)
    round_file = json.loads((Path(agg) / run_id / "round.json").read_text())
    headers = relkit.merged_headers(agg, run_id)
    if first:
        assert round_file["status"] == "open" and not headers, (round_file, headers)
        assert relkit.part_token(agg, run_id, 1) == round_file["token"], "the follower's part of the crashed round is left"
        return None, leader.rows + res[1].rows
    assert round_file["status"] == "closed" and (2 in headers) == (kind == "published"), (round_file, sorted(headers))  # rounds count from 1
    return leader.states[0], leader.rows + res[1].rows


@pytest.mark.parametrize("kind", ["unpublished", "published-replay", "published-later", "first"])
def test_stale_round_files_of_a_crashed_attempt(tmp_path, rel, kind):
    """A new attempt with the same run_id, whose follower reads the stale round file first.

    ``unpublished``: the leader died before publishing an announced round (round.json closed,
    parts of the dead round left). ``published-*``: it died right after publishing it, so that
    merged file is left too; the new attempt restores the last good state (step 1) and
    checkpoints at step 2 (``replay``: the progress of the stale merged file) or step 3
    (``later``). ``first``: it died in the launch's first round, leaving round.json open with the
    follower's part in it: the new follower joins that round, and the new leader sends it on.
    The new leader starts only after the follower read round.json (and, for ``first``, wrote its
    part into the stale round). Both ranks must return the new merged state.
    """
    agg, run_id, W = str(tmp_path / "agg"), "job-stale", 2
    restore_state, first_rows = _leftovers(kind.split("-")[0], tmp_path, agg, run_id)
    done = 0 if restore_state is None else 1
    total = 3 if kind.endswith("later") else 2
    seen = str(tmp_path / "follower-went-first")
    restore = write_json(tmp_path / "restore.json", restore_state) if restore_state is not None else None
    common = dict(agg=agg, run_id=run_id, world_size=W, segments=[per_rank(total - done, W)], restore=restore, tag="attempt2")
    observe = {"observe_write": seen} if kind == "first" else {"observe_round": seen}
    cfgs = [
        rank_config(tmp_path, rank=0, timeout_s=FAIL_TIMEOUT * 2, gate={"round": 0, "wait_for": seen, "timeout": 60}, **common),
        rank_config(tmp_path, rank=1, timeout_s=FAIL_TIMEOUT * 2, **observe, **common),
    ]
    res = run_ranks(cfgs, timeout=120)
    ok = all(r.returncode == 0 and r.error is None for r in res)
    rel.case(f"stale round files of a crashed attempt ({kind}), follower first",
             "follower waits for (or is sent on to) the new leader's round; both return the new merged state" if ok else "FAILED: " + "; ".join(
        f"rank {r.cfg['rank']}: {r.error['message'] if r.error else f'rc={r.returncode}'}" for r in res if r.error or r.returncode))
    for r in res:
        assert r.returncode == 0 and r.error is None, r
    assert res[0].states == res[1].states
    account(rel, f"stale round files ({kind}): rows", first_rows, done, res, total, res[0].states[-1], outcome="0 lost, 0 duplicated")


def test_slow_follower_is_not_carried_into_the_next_round(tmp_path, rel):
    """The leader starts checkpoint k+1 before a follower has read merged k.

    Nothing orders the two when no collective runs between the checkpoints
    (loader-only ranks, a second ``state_dict()`` at the same step). The
    leader keeps merged k for such a slow follower; the follower must return
    merged k for its call k, not join round k+1 with its step-k state.
    Every state any rank returns must be the progress at that checkpoint.
    """
    W = 2
    kw = {1: {"fault": {"kind": "slow_follower", "round": 0}}}
    cfgs = group(kw, W, tmp_path, agg=str(tmp_path / "agg"), run_id="job-slow", segments=[per_rank(1, W), per_rank(1, W)],
                 timeout_s=FAIL_TIMEOUT * 2, tag="slow", step_barrier=False)
    res = run_ranks(cfgs, timeout=90)
    wrong = [(r.cfg["rank"], k) for r in res for k, st in enumerate(r.states) if st["lanes"] != reference_lanes(k + 1)]
    errors = [f"rank {r.cfg['rank']}: {r.error['message'][:120]}" for r in res if r.error]
    rel.case("slow follower, leader already in the next round (no collective between checkpoints)",
             "follower returns round k's merged state; round k+1 holds only step k+1 progress" if not wrong and not errors else f"FAILED: inconsistent merged states {wrong}; {errors}")
    assert not wrong, f"(rank, checkpoint) pairs that returned a state mixing two steps: {wrong}"
    for r in res:
        assert r.returncode == 0 and r.error is None, r
    assert res[0].states == res[1].states


def test_new_leader_cleanup_while_a_follower_writes_into_the_stale_round(tmp_path, rel):
    """A follower of the new attempt is writing its state into the crashed
    attempt's round (its part file open, not yet closed) when the new
    leader removes the crashed attempt's files and opens its round. The
    follower must move to the new round, not fail the checkpoint."""
    agg, run_id, W = str(tmp_path / "agg"), "job-midwrite", 2
    _, first_rows = _leftovers("first", tmp_path, agg, run_id)  # round.json left open: the new follower joins that round
    marker = str(tmp_path / "follower-mid-write")
    common = dict(agg=agg, run_id=run_id, world_size=W, segments=[per_rank(2, W)], tag="attempt2", timeout_s=FAIL_TIMEOUT * 2)
    cfgs = [
        rank_config(tmp_path, rank=0, gate={"round": 0, "wait_for": marker, "timeout": 60}, **common),
        rank_config(tmp_path, rank=1, fault={"kind": "stall_mid_state_write", "round": 0, "marker": marker}, **common),
    ]
    res = run_ranks(cfgs, timeout=90)
    ok = all(r.returncode == 0 and r.error is None for r in res)
    rel.case("new leader cleans up while a follower writes into the stale round",
             "the part being written left alone; follower moves to the new round" if ok else "FAILED: " + "; ".join(
        f"rank {r.cfg['rank']}: {r.error['message'][:150] if r.error else f'rc={r.returncode}'}" for r in res if r.error or r.returncode))
    for r in res:
        assert r.returncode == 0 and r.error is None, r
    account(rel, "new leader cleans up while a follower writes: rows", first_rows, 0, res, 2, res[0].states[-1], outcome="0 lost, 0 duplicated")


def test_planted_garbage_in_the_run_folder_is_never_merged(tmp_path, rel):
    """Files a crashed or foreign writer left (any name, any content) do not enter a new round."""
    agg, run_id, W = tmp_path / "agg", "job-garbage", 2
    d = agg / run_id
    d.mkdir(parents=True)
    (d / "round.json").write_text('{"token": "00000000000000000000000000000000", "round": 7, "world_size": 2}')
    (d / "state-00000000000000000000000000000000-00001.json").write_text('{"truncated": ')
    (d / "part-1.json").write_text('{"kind": "zephon.part", "token": "0000')  # a crashed writer's, under this run's name
    (d / "merged-00000000000000000000000000000000.json").write_bytes(b"\x80\x04\x95garbage")
    (d / ".tmp-abandoned").write_text('{"half": ')
    (d / "notes.txt").write_text("not ours")
    # The leader goes first (the follower waits until the planted files are
    # gone): it must clean up before it opens its round.
    kw = {1: {"gate": {"round": 0, "wait_gone": str(d / "merged-00000000000000000000000000000000.json")}}}
    cfgs = group(kw, W, tmp_path, agg=str(agg), run_id=run_id, segments=[per_rank(2, W)], timeout_s=OK_TIMEOUT, tag="a")
    res = run_ranks(cfgs, timeout=120)
    for r in res:
        assert r.returncode == 0 and r.error is None, r
    account(rel, "garbage planted in the run folder (round, state, merged, .tmp-, other files)", [], 0, res, 2, res[0].states[-1],
            outcome="removed by the leader (or overwritten) before its round; never merged")


def test_two_jobs_share_one_aggregate_dir(tmp_path, rel):
    agg, W, steps = str(tmp_path / "agg"), 2, 4
    jobs = {"job-a": 7, "job-b": 8}
    cfgs = []
    for run_id, seed in jobs.items():
        cfgs += group({}, W, tmp_path, agg=agg, run_id=run_id, seed=seed, segments=[per_rank(1, W)] * steps, timeout_s=OK_TIMEOUT, tag=run_id)
    res = run_ranks(cfgs, timeout=150)
    for r in res:
        assert r.returncode == 0 and r.error is None, r
    for n, (run_id, seed) in enumerate(jobs.items()):
        mine = res[n * W : (n + 1) * W]
        assert mine[0].states == mine[1].states and len(mine[0].states) == steps
        for k, st in enumerate(mine[0].states):
            assert st["lanes"] == reference_lanes(k + 1, seed), f"{run_id}: checkpoint {k} is not its own progress"
        checked, lost, dup = compare(by_step(rec for r in mine for rec in r.rows), reference(steps, seed))
        rel.case(f"two concurrent jobs share aggregate_dir: {run_id}", "each checkpoints only its own progress", samples=checked, lost=lost, duplicated=dup)
        assert (lost, dup) == (0, 0)
    assert res[0].states[0]["fingerprint"] != res[W].states[0]["fingerprint"]


_SPY = r"""
import hashlib, json, os, sys, time, fsspec
path, stop, out, so = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
fs, _, (root,) = fsspec.get_fs_token_paths(path, storage_options=so)
reads = {"round": 0, "part": 0, "merged": 0}
bad = []
torn = 0
while not os.path.exists(stop):
    time.sleep(0.001)  # throttle only: the ranks share 2 cores with this loop
    fs.invalidate_cache(root)
    try:
        names = [p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)]
    except FileNotFoundError:
        continue
    for n in names:
        kind = n.split("-")[0].split(".")[0]
        if kind not in reads:
            continue
        try:
            data = fs.cat_file(root + "/" + n)
        except FileNotFoundError:
            continue
        head, _, body = data.partition(b"\n")  # a merged file or a part: header line, then the rest
        if kind == "part":  # written in place: a reader may catch it mid-write, and must then see its hash fail
            try:
                whole = hashlib.sha256(body).hexdigest() == json.loads(head)["sha256"]
            except (ValueError, KeyError, TypeError):
                whole = False
            reads["part"] += whole
            torn += not whole
            continue
        try:
            json.loads(head)
            if kind == "merged" and b'"zephon.merged"' in head:
                json.loads(body)
            reads[kind] += 1
        except ValueError:
            bad.append((n, len(data)))
json.dump({"reads": reads, "bad": bad, "torn_parts": torn}, open(out, "w"))
"""


@pytest.mark.parametrize("where", ["local", "s3"])
def test_readers_never_see_a_partial_file(tmp_path, rel, where, request):
    """A spy process reads every round/part/merged file while the ranks write them.

    round.json and merged files are published atomically: never seen partial. Parts
    are written in place: a read mid-write must fail the part's SHA-256 (which is
    what makes the protocol's reader, ``records.decode_part``, leave it)."""
    run_id, W = f"job-spy-{uuid.uuid4().hex[:6]}", 2
    so = None
    if where == "s3":
        ep = request.getfixturevalue("s3_endpoint")
        agg, so, rounds = ep.url("reliability", "spy"), ep.storage_options, 8
    else:
        agg, rounds = str(tmp_path / "agg"), 30
    folder = agg.rstrip("/") + "/" + run_id
    stop, out = tmp_path / "stop", tmp_path / "spy.json"
    spy = subprocess.Popen([sys.executable, "-c", _SPY, folder, str(stop), str(out), json.dumps(so or {})], env=relkit.child_env())
    try:
        cfgs = group({}, W, tmp_path, agg=agg, run_id=run_id, segments=[per_rank(1, W)] * rounds, timeout_s=OK_TIMEOUT, storage_options=so, tag="spy")
        res = run_ranks(cfgs, timeout=150)
    finally:
        stop.write_text("")
        spy.wait(timeout=60)
    for r in res:
        assert r.returncode == 0 and r.error is None, r
    assert res[0].states == res[1].states and len(res[0].states) == rounds
    report = json.loads(out.read_text())
    total = sum(report["reads"].values())
    rel.case(f"reader polls every round/part/merged file while {rounds} rounds are written ({where})",
             f"{total} whole reads; {report['torn_parts']} parts caught mid-write, all failing their hash" if not report["bad"] else "partial read")
    assert report["bad"] == [], f"a reader saw partial files: {report['bad'][:5]}"
    assert total > 0
    checked, lost, dup = compare(by_step(rec for r in res for rec in r.rows), reference(rounds))
    rel.case(f"reader during writes ({where}): rows", "0 lost, 0 duplicated", samples=checked, lost=lost, duplicated=dup)
    assert (lost, dup) == (0, 0)


@pytest.mark.parametrize("case", ["path-under-a-file", "read-only-folder", "leader-disk-full", "follower-disk-full"])
def test_aggregate_dir_unwritable_or_full(tmp_path, rel, case):
    W = 2
    work = relkit.shared_tmpdir()  # reachable by an unprivileged rank
    try:
        run_id = "job-io"
        agg = work / "agg"
        kw: dict = {}
        if case == "path-under-a-file":
            (work / "plain-file").write_text("x")
            agg = work / "plain-file" / "agg"
        elif case == "read-only-folder":
            (agg / run_id).mkdir(parents=True)
            (agg / run_id).chmod(0o555)
            if os.geteuid() == 0:  # root writes anywhere: the ranks drop to an unprivileged user
                kw = {r: {"fault": {"kind": "unprivileged", "round": 0}} for r in range(W)}
        else:
            kw = {0 if case.startswith("leader") else 1: {"fault": {"kind": "file_size_limit", "bytes": 200, "round": 0}}}
        cfgs = group(kw, W, work, agg=str(agg), run_id=run_id, segments=[per_rank(1, W)], timeout_s=FAIL_TIMEOUT, tag="io")
        for c in cfgs:  # the results are written before any privilege is dropped
            Path(c["out"]).touch()
        res = run_ranks(cfgs, timeout=90)
        for r in res:
            assert r.returncode == 3 and r.error and r.error["type"] == "AggregationError", r
            assert not r.states
        msgs = [r.error["message"] for r in res]
        if case == "path-under-a-file":
            assert all("cannot create aggregate folder" in m and str(work / "plain-file") in m for m in msgs), msgs
        elif case == "read-only-folder":
            assert "cannot write" in msgs[0] and "round.json" in msgs[0] and "Permission denied" in msgs[0], msgs
        elif case == "leader-disk-full":
            assert "cannot write" in msgs[0] and "merged-" in msgs[0] and "File too large" in msgs[0], msgs
            assert "leader published no merged state" in msgs[1], msgs
        else:
            assert "cannot write" in msgs[1] and "part-1.json" in msgs[1] and "File too large" in msgs[1], msgs
            assert "global rank(s) [1]" in msgs[0], msgs
        if case.endswith("disk-full"):
            names = os.listdir(agg / run_id)
            assert not [n for n in names if n.startswith(".tmp-") or n.startswith("merged-")], names
            # space is back: the same run_id checkpoints from the start
            second, final = recover(work, str(agg), run_id, W, relkit.pipeline(7, canonical_replicas=C).local_state(), 0, 2, tag="io2")
            who, other = ("leader", "follower times out: 'leader published no merged state'") if case.startswith("leader") else (
                "follower", "leader names rank 1 as missing")
            rel.case(f"aggregate_dir full ({who}; RLIMIT_FSIZE -> EFBIG)",
                     f"{who}: AggregationError 'cannot write ...: File too large', no partial file; {other}")
            account(rel, f"aggregate_dir full ({who}): rows after space is back", [], 0, second, 2, final)
        elif case == "path-under-a-file":
            rel.case("aggregate_dir below a plain file", "every rank: AggregationError 'cannot create aggregate folder ...: Not a directory'")
        else:
            rel.case("aggregate_dir read-only (unprivileged ranks)",
                     "leader: AggregationError 'cannot write .../round.json: Permission denied'; followers time out naming the leader")
    finally:
        if (work / "agg" / "job-io").exists():
            (work / "agg" / "job-io").chmod(0o755)
        import shutil

        shutil.rmtree(work, ignore_errors=True)
