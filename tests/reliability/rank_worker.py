"""One rank of a reliability scenario, run as a real process.

    python rank_worker.py <config.json>      (see relkit.rank_config)

It builds the rank's pipeline, optionally restores a state, then for each
segment ``k`` takes ``segments[k]`` batches and calls ``checkpoint()``. After
every checkpoint it rewrites its result file: the rows it delivered (with lane
and lane index) and the merged states it got back; on a ZephonError it records
the error and exits with status 3.

Faults are injected from outside zephon_core, in this process only:
``fault = {"kind": ..., "round": k}`` with kind

* ``kill_before_checkpoint``   SIGKILL instead of calling checkpoint ``k``;
* ``kill_before_state_write``  SIGKILL when about to write its ``part-*`` file;
* ``kill_mid_state_write``     write half of the ``part-*`` bytes, then SIGKILL;
* ``stall_mid_state_write``    write the ``part-*`` bytes, create ``marker`` and
                               stall (before closing the file) until another
                               round is opened;
* ``kill_before_part_merge``   (a merging writer) SIGKILL once it has read the
                               parts it merges, before writing its own;
* ``kill_before_publish``      (leader) SIGKILL when about to write the merged state;
* ``kill_after_publish``       (leader) SIGKILL right after writing it;
* ``slow_follower``            after writing its ``part-*`` file, stall before its
                               first look at the merged state until the leader has
                               published it and gone on to the next checkpoint;
* ``file_size_limit``          RLIMIT_FSIZE of ``bytes`` during the checkpoint
                               (writes fail with EFBIG, as on a full disk);
* ``unprivileged``             drop to uid/gid 65534 before the checkpoint.

``barrier = {"dir": path, "n": W}`` waits for all W ranks to be up before
the first checkpoint and, as a training step's collective would, for all of
them to return from checkpoint k before checkpoint k+1 (``step_barrier``,
default true); ``gate = {"round": k, "wait_for": path}`` waits for a file before checkpoint
``k``; (``wait_gone``: until a file is gone; ``round_not``: until round.json holds
another token); ``observe_round = path`` creates that file once this rank has read
``round.json`` (so a test can order a new leader after a stale read),
``observe_write = path`` once it has written a ``part-*`` file.
``fan_in`` sets the merge tree's fan-in (small worlds then have merging writers).
"""

from __future__ import annotations

import glob
import json
import os
import resource
import signal
import sys
import time


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # never reached


def main() -> int:
    cfg = json.load(open(sys.argv[1]))
    import fsspec
    import relkit

    from zephon_core import ZephonError
    from zephon_core.checkpoint import gather, tree
    from zephon_core.checkpoint.folder import AggregateFolder
    from zephon_core.checkpoint.names import ROUND_FILE
    from zephon_core.checkpoint.records import decode_round

    if cfg.get("fan_in"):
        tree.FAN_IN = cfg["fan_in"]

    held: dict = {"out": None}  # a result file kept open while privileged (see "unprivileged")

    result: dict = {"rank": cfg["rank"], "rows": [], "states": [], "error": None}

    def save() -> None:
        data = json.dumps(result)
        try:  # atomically, so a rank killed from outside leaves its last whole result
            tmp = cfg["out"] + ".tmp"
            with open(tmp, "w") as f:
                f.write(data)
            os.replace(tmp, cfg["out"])
        except PermissionError:  # after dropping privileges: rewrite the file held open
            out = held["out"]
            out.seek(0)
            out.truncate()
            out.write(data)
            out.flush()

    current: dict = {"round": -1, "partial": None}
    fault = cfg.get("fault") or {}

    def armed(kind: str) -> bool:
        return fault.get("kind") == kind and fault.get("round", 0) == current["round"]

    def touch(path: str) -> None:
        open(path, "w").close()

    orig_put, orig_write, orig_get = AggregateFolder.put, AggregateFolder.write, AggregateFolder.get

    def round_token(folder):
        rf = decode_round(orig_get(folder, ROUND_FILE), cfg["world_size"])
        return rf.round.token if rf else None

    def writing(self, name, data, orig):
        publishing = name.startswith("merged-") and b'"kind":"zephon.merged"' in data[:40]  # not a note sending readers on
        if name.startswith("part-") and armed("kill_before_state_write"):
            die()
        if publishing and armed("kill_before_publish"):
            die()
        current["partial"] = None
        if name.startswith("part-") and (armed("kill_mid_state_write") or armed("stall_mid_state_write")) and not current.get("stalled_write"):
            current["partial"] = (self, round_token(self))
            current["stalled_write"] = True  # once
        orig(self, name, data)
        current["partial"] = None
        if publishing and armed("kill_after_publish"):
            die()
        if name.startswith("part-") and cfg.get("observe_write"):
            touch(cfg["observe_write"])
        if name.startswith("part-") and armed("slow_follower") and not current.get("stalled"):
            current["joined"] = True

    def put(self, name, data):
        writing(self, name, data, orig_put)

    def write(self, name, data):  # parts: written in place
        writing(self, name, data, orig_write)

    observed = {"done": False}

    def get(self, name):
        if name.startswith("merged-") and current.get("joined") and armed("slow_follower"):
            # Descheduled before its first look, long enough for the leader to publish
            # this round and start the next checkpoint (no collective in between).
            current["joined"], current["stalled"] = None, True
            relkit.wait_for(lambda: orig_get(self, name) is not None, 60, "the merged state")
            time.sleep(1.0)
        value = orig_get(self, name)
        if name == ROUND_FILE and cfg.get("observe_round") and not observed["done"]:
            observed["done"] = True
            touch(cfg["observe_round"])
        return value

    orig_await = gather.Gatherer.await_parts

    def await_parts(self, level, kids):
        got = yield from orig_await(self, level, kids)
        if armed("kill_before_part_merge"):
            die()
        return got

    real_fdopen = os.fdopen

    def fdopen(fd, *args, **kwargs):
        f = real_fdopen(fd, *args, **kwargs)
        if current["partial"] is None:
            return f
        folder, token = current["partial"]

        class FaultyWriter:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                f.close()

            def write(self, data):
                if fault["kind"] == "kill_mid_state_write":
                    f.write(data[: len(data) // 2])
                    f.flush()
                    os.fsync(f.fileno())
                    die()
                f.write(data)
                # stall_mid_state_write: the bytes are written, the file not yet
                # closed; stall until the leader has opened another round.
                touch(fault["marker"])
                relkit.wait_for(lambda: round_token(folder) not in (None, token), 60, "a new round")

            def __getattr__(self, name):
                return getattr(f, name)

        return FaultyWriter()

    AggregateFolder.put, AggregateFolder.write, AggregateFolder.get = put, write, get
    gather.Gatherer.await_parts = await_parts
    os.fdopen = fdopen

    options = dict(
        world_size=cfg["world_size"],
        global_rank=cfg["rank"],
        dp_degree=cfg["dp_degree"],
        dp_group_id=cfg["dp_group_id"],
        aggregate_dir=cfg["agg"],
        run_id=cfg["run_id"],
        aggregate_timeout_s=cfg["timeout_s"],
    )
    if cfg.get("storage_options"):
        options["storage_options"] = cfg["storage_options"]
    try:
        p = relkit.pipeline(cfg["seed"], **options)
        if cfg.get("restore"):
            with open(cfg["restore"]) as f:
                p.restore(json.load(f))
        it = iter(p)
        for k, n in enumerate(cfg["segments"]):
            current["round"] = k
            for _ in range(n):
                result["rows"].append(relkit.batch_record(next(it)))
            save()
            if k == 0 and cfg.get("barrier"):
                # Every rank of the attempt is up before the first checkpoint, so
                # a short aggregate_timeout_s measures the protocol, not start-up.
                b = cfg["barrier"]
                open(os.path.join(b["dir"], f"ready-{cfg['rank']}"), "w").close()
                relkit.wait_for(lambda: len(glob.glob(os.path.join(b["dir"], "ready-*"))) >= b["n"], 120, "all ranks to start")
            gate = cfg.get("gate") or {}
            if gate.get("round", 0) == k and gate.get("wait_for"):
                relkit.wait_for(lambda: glob.glob(gate["wait_for"]), gate.get("timeout", 60), gate["wait_for"])
            if gate.get("round", 0) == k and gate.get("round_not"):
                fs, _, (root,) = fsspec.get_fs_token_paths(cfg["agg"], storage_options=cfg.get("storage_options") or {})
                where = f"{root.rstrip('/')}/{cfg['run_id']}/{ROUND_FILE}"

                def new_round() -> bool:
                    try:
                        return json.loads(fs.cat_file(where)).get("token") != gate["round_not"]
                    except (FileNotFoundError, ValueError):
                        return False

                relkit.wait_for(new_round, gate.get("timeout", 60), "the new leader's round")
            if gate.get("round", 0) == k and gate.get("wait_gone"):
                relkit.wait_for(lambda: not os.path.exists(gate["wait_gone"]), gate.get("timeout", 60), f"{gate['wait_gone']} to go")
            if armed("kill_before_checkpoint"):
                die()
            limited = armed("file_size_limit")
            if limited:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (int(fault["bytes"]), resource.RLIM_INFINITY))
            if armed("unprivileged"):
                held["out"] = open(cfg["out"], "r+")
                import fsspec

                fsspec.get_fs_token_paths(cfg["agg"])  # lazy imports happen while still privileged

                os.setgid(65534)
                os.setuid(65534)
            try:
                state = p.checkpoint()
            finally:
                if limited:
                    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            result["states"].append(state)
            save()
            if cfg.get("barrier") and cfg.get("step_barrier", True) and k + 1 < len(cfg["segments"]):
                # Training runs a collective step between two checkpoints, so no
                # rank starts checkpoint k+1 before every rank returned from k.
                b = cfg["barrier"]
                open(os.path.join(b["dir"], f"done-{k}-{cfg['rank']}"), "w").close()
                relkit.wait_for(lambda: len(glob.glob(os.path.join(b["dir"], f"done-{k}-*"))) >= b["n"], 120, f"all ranks to finish checkpoint {k}")
        p.close()
    except ZephonError as e:
        result["error"] = {"type": type(e).__name__, "message": str(e)}
        save()
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
