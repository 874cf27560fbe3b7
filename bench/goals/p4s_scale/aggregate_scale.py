"""Checkpoint aggregation at cluster scale: many simulated ranks, each with its own Aggregator and state.

    PYTHONPATH=.:bench python bench/goals/p4s_scale/aggregate_scale.py --ranks 16384 --tp 8 --pp 16 --backend local
    PYTHONPATH=.:bench python bench/goals/p4s_scale/aggregate_scale.py
        --ranks 16384 --tp 8 --pp 16 --backend s3 --latency-ms 20
    PYTHONPATH=.:bench python bench/goals/p4s_scale/aggregate_scale.py
        --ranks 512 --tp 1 --mode processes      (one real process per rank)

Ranks are laid out as TorchTitan lays out its mesh (``pp, dp, cp, tp``, tp
innermost): global rank ``((pp_i * dp + g) * cp + cp_i) * tp + tp_i`` is in dp
group ``g``; ``canonical_replicas`` defaults to dp. ``--mode tasks`` (the default)
runs the ranks as asyncio tasks of ``--processes`` forked processes (round-robin),
each task driving its Aggregator's steps (``Aggregator.steps``) with its file
operations inline; ``threads`` runs a thread per rank instead (needed on s3, whose
requests block); ``processes`` forks one process per rank. Every round starts when all ranks are ready (as after
a training step's collective); its latency is the last rank's return minus the
first rank's call. Each rank's folder operations and bytes are counted with
``fsops.count``; on s3 the server also counts the requests it served. Prints one
JSON line (``RESULT {...}``) and a summary; timings are the machine's, never
asserted (a 2-core machine runs 16,384 ranks' Python on 2 cores).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from measure import emit

from zephon_core.checkpoint.aggregate import Aggregator
from zephon_core.checkpoint.state import canonical_json, make_state
from zephon_dev.fsops import count

ROOT = Path(__file__).resolve().parents[3]


def definition() -> dict[str, Any]:
    """A real pipeline's data definition (so states have their real size)."""
    import numpy as np

    from zephon_core import MemorySource, Pipeline, StaticMixture

    src = MemorySource([np.arange(40) + i for i in range(256)], name="corpus")
    return Pipeline(StaticMixture([src], seed=1, chunk_size=4)).pack(2048).batch(8).definition()


def group_of(rank: int, a: argparse.Namespace) -> int:
    return (rank // (a.cp * a.tp)) % a.dp


def local_state(defn: dict[str, Any], rank: int, step: int, a: argparse.Namespace) -> dict[str, Any]:
    from zephon_core.batch import Cursor
    from zephon_core.checkpoint.state import LaneState
    from zephon_core.lane.assignment import owned_lanes

    g = group_of(rank, a)
    topo = {"dp_degree": a.dp, "dp_group_id": g, "world_size": a.ranks, "global_rank": rank}
    return make_state(
        defn, a.lanes, topo, {lane: LaneState(Cursor(step, 3, 17, 0), step) for lane in owned_lanes(a.lanes, a.dp, g)}
    )


class SimRank:
    """One simulated rank: its Aggregator, its counted folder, and what it saw in each round."""

    def __init__(self, rank: int, a: argparse.Namespace, base: str, so: dict[str, Any]) -> None:
        self.rank = rank
        self.agg = Aggregator(base, a.run_id, a.ranks, rank, a.timeout, so, fan_in=a.fan_in)
        if a.follow_budget:
            import dataclasses

            self.agg.dir.pacing = dataclasses.replace(self.agg.dir.pacing, follow_budget=a.follow_budget)
        self.ops = count(self.agg.dir)
        self.state: dict[str, Any] | None = None
        self.merged: dict[str, Any] | None = None
        self.out: dict[str, Any] = {}
        self.check_each = a.check_each

    def round(self) -> None:
        assert self.state is not None
        self.ops.reset()
        t0 = time.monotonic()
        try:
            merged = self.agg.checkpoint(self.state)
            err = None
        except Exception as e:  # reported, never hangs the harness
            merged, err = None, f"{type(e).__name__}: {e}"
        self.done(t0, merged, err)

    async def round_async(self) -> None:
        """The same round as an asyncio task: the Aggregator's steps, its pauses awaited."""
        import asyncio

        assert self.state is not None
        self.ops.reset()
        t0 = time.monotonic()
        steps = self.agg.steps(self.state)
        merged, err = None, None
        try:
            while True:
                await asyncio.sleep(next(steps))
        except StopIteration as finished:
            merged = finished.value
        except Exception as e:  # reported, never hangs the harness
            err = f"{type(e).__name__}: {e}"
        self.done(t0, merged, err)

    def done(self, t0: float, merged: dict[str, Any] | None, err: str | None) -> None:
        t1 = time.monotonic()
        wrote = self.ops.by_kind["put"] + self.ops.by_kind["rename"] + self.ops.by_kind["write"] > 0
        self.merged = merged  # checked once every rank of the process is done, so as not to slow the others down
        self.out = {"rank": self.rank, "t0": t0, "t1": t1, "error": err, "ops": self.ops.as_dict(), "wrote": wrote}
        if self.check_each:
            self.check()

    def check(self) -> None:
        merged, self.merged = self.merged, None
        self.out.update(
            digest=hashlib.sha256(canonical_json(merged).encode()).hexdigest()[:16] if merged else None,
            lanes=len(merged["lanes"]) if merged else 0,
            delivered=sorted({v["delivered"] for v in merged["lanes"].values()}) if merged else None,
        )


def run_threads(sims: list[SimRank], barrier: Any) -> float:
    """One round, a thread per rank; returns the CPU seconds the process used."""
    go = threading.Event()
    threads = [threading.Thread(target=lambda s=s: (go.wait(), s.round())) for s in sims]
    for t in threads:
        t.start()
    barrier.wait()
    cpu = time.process_time()
    go.set()
    for t in threads:
        t.join()
    return time.process_time() - cpu


def run_tasks(sims: list[SimRank], barrier: Any) -> float:
    """One round, an asyncio task per rank (its file operations run inline: on a local folder they take
    microseconds)."""
    import asyncio

    async def everyone() -> None:
        await asyncio.gather(*(s.round_async() for s in sims))

    barrier.wait()
    cpu = time.process_time()
    asyncio.run(everyone())
    return time.process_time() - cpu


def worker(
    ranks: list[int], a: argparse.Namespace, base: str, so: dict[str, Any], defn: dict[str, Any], barrier: Any, q: Any
) -> None:
    try:
        threading.stack_size(512 * 1024)
        # Hundreds of threads waiting for the GIL each wake at every switch interval to ask for it: at
        # the default 5 ms that spinning, not the ranks' work, would use most of the CPU. The ranks
        # release the GIL at every file operation and sleep anyway.
        sys.setswitchinterval(a.switch_interval)
        sims = [SimRank(r, a, base, so) for r in ranks]
        barrier.wait()  # every Aggregator made (each made its folder: requests not of any round)
        for k in range(a.rounds):
            for s in sims:
                s.state = local_state(defn, s.rank, k + 1, a)
            # Thousands of ranks' states in one process would have the cyclic garbage collector scan them
            # again and again during the round; one rank's process holds one. Nothing here makes cycles.
            gc.collect()
            gc.disable()
            cpu = (run_tasks if a.mode == "tasks" else run_threads)(sims, barrier)
            gc.enable()
            for s in sims:
                s.check()
            q.put([{**s.out, "cpu_s": cpu if n == 0 else 0.0} for n, s in enumerate(sims)])
    except BaseException as e:  # reported, never hangs the parent
        q.put([{"rank": -1, "error": repr(e)}])
        barrier.abort()
    finally:
        os._exit(0)


def summarize(
    k: int, outs: list[dict[str, Any]], server_counts: dict[str, int] | None, a: argparse.Namespace
) -> dict[str, Any]:
    errors = [o["error"] for o in outs if o.get("error")]
    res: dict[str, Any] = {"round": k + 1, "errors": errors[:3], "error_count": len(errors)}
    if errors or len(outs) != a.ranks:
        return res
    ops = [o["ops"]["metadata"] for o in outs]
    kinds: dict[str, int] = {}
    files: dict[str, int] = {}
    for o in outs:
        for kind, n in o["ops"]["by_kind"].items():
            kinds[kind] = kinds.get(kind, 0) + n
        for f, n in o["ops"]["by_file"].items():
            files[f] = files.get(f, 0) + n
    roles: dict[str, list[int]] = {}
    for o in outs:
        roles.setdefault(role_of(o), []).append(o["ops"]["metadata"])
    start = min(o["t0"] for o in outs)
    ends = sorted(o["t1"] - start for o in outs)
    res.update(
        latency_s=ends[-1],
        cpu_s=sum(o.get("cpu_s", 0.0) for o in outs),
        leader_s=next(o["t1"] for o in outs if o["rank"] == 0) - start,
        returns_p50_s=ends[len(ends) // 2],
        arrivals_s=max(o["t0"] for o in outs) - start,
        writers=sum(o["wrote"] for o in outs),
        ops_per_rank_mean=statistics.fmean(ops),
        ops_per_rank_max=max(ops),
        ops_by_kind_per_rank={kd: n / a.ranks for kd, n in sorted(kinds.items())},
        ops_by_file_per_rank={f: n / a.ranks for f, n in sorted(files.items())},
        ops_by_role={
            r: {"ranks": len(v), "mean": statistics.fmean(v), "max": max(v)} for r, v in sorted(roles.items())
        },
        bytes_read_per_rank=statistics.fmean(o["ops"]["bytes_read"] for o in outs),
        bytes_written_per_rank=statistics.fmean(o["ops"]["bytes_written"] for o in outs),
        identical=len({o["digest"] for o in outs}) == 1,
        lanes=outs[0]["lanes"],
        delivered=outs[0]["delivered"],
    )
    if server_counts is not None:
        res["server_requests_per_rank"] = {kd: n / a.ranks for kd, n in sorted(server_counts.items())}
    return res


def role_of(o: dict[str, Any]) -> str:
    """leader (rank 0), merger (a writer that read parts), writer, or reader (reads the merged state only)."""
    if o["rank"] == 0:
        return "leader"
    if o["ops"]["by_file"].get("part", 0) > (1 if o["wrote"] else 0):
        return "merger"
    return "writer" if o["wrote"] else "reader"


def run(a: argparse.Namespace) -> dict[str, Any]:
    if a.mode == "auto":
        a.mode = "threads" if a.backend == "s3" else "tasks"
    assert not (a.mode == "tasks" and a.backend == "s3"), "s3 requests block: run its ranks as threads"
    a.dp = a.ranks // (a.tp * a.pp * a.cp)
    assert a.dp * a.tp * a.pp * a.cp == a.ranks, "ranks must be tp * pp * cp * dp"
    a.lanes = a.lanes or a.dp
    a.run_id = f"scale-{uuid.uuid4().hex[:8]}"
    server, so = None, {}
    if a.backend == "s3":
        from zephon_dev.s3_server import S3Server

        server = S3Server(bucket="zephon-scale", mode="process", latency_s=a.latency_ms / 1000)
        so = server.start().storage_options
        base = f"s3://zephon-scale/agg-{a.run_id}"
    else:
        base = a.dir or str(ROOT / "bench" / ".work" / "aggregate-scale")
        os.makedirs(base, exist_ok=True)
    defn = definition()
    nproc = a.ranks if a.mode == "processes" else min(a.processes, a.ranks)
    shards = [list(range(p, a.ranks, nproc)) for p in range(nproc)]
    ctx = mp.get_context("fork")
    barrier, q = ctx.Barrier(nproc + 1), ctx.SimpleQueue()
    gc.collect()
    gc.freeze()  # forked children share the parent's objects instead of copying them on first touch
    procs = [ctx.Process(target=worker, args=(s, a, base, so, defn, barrier, q), daemon=True) for s in shards]
    t_start = time.monotonic()
    for p in procs:
        p.start()
    rounds = []
    try:
        barrier.wait(timeout=600)
        for k in range(a.rounds):
            if server is not None:
                server.reset_stats()
            barrier.wait(timeout=600)
            outs: list[dict[str, Any]] = []
            for _ in procs:
                outs += q.get()
            rounds.append(summarize(k, outs, server.stats() if server is not None else None, a))
            if rounds[-1]["error_count"]:
                break
    finally:
        for p in procs:
            p.join(timeout=60)
        if server is not None:
            server.stop()
    return {**_setting(a, nproc), "rounds": rounds, "wall_s": time.monotonic() - t_start, "cpus": os.cpu_count(),
            "loadavg": os.getloadavg()}


def _setting(a: argparse.Namespace, nproc: int) -> dict[str, Any]:
    """The run's layout and store, as its result reports them."""
    return {"ranks": a.ranks, "tp": a.tp, "pp": a.pp, "cp": a.cp, "dp": a.dp, "lanes": a.lanes, "fan_in": a.fan_in,
            "backend": a.backend, "latency_ms": a.latency_ms if a.backend == "s3" else 0, "mode": a.mode,
            "processes": nproc}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--pp", type=int, default=16)
    ap.add_argument("--cp", type=int, default=1)
    ap.add_argument("--lanes", type=int, default=0, help="canonical_replicas (default: the dp degree)")
    ap.add_argument("--backend", choices=["local", "s3"], default="local")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="delay the S3 server adds to every request")
    ap.add_argument(
        "--mode",
        choices=["auto", "tasks", "threads", "processes"],
        default="auto",
        help="auto: tasks on a local folder, threads on s3",
    )
    ap.add_argument(
        "--processes", type=int, default=4, help="processes the ranks are spread over (--mode tasks or threads)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fan-in", type=int, default=16)
    ap.add_argument(
        "--follow-budget", type=float, default=0.0, help="override Pacing.follow_budget (looks a second, all ranks)"
    )
    ap.add_argument(
        "--switch-interval", type=float, default=0.1, help="sys.setswitchinterval of the processes of threads"
    )
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument(
        "--check-each", action="store_true", help="digest each rank's merged state as it returns and drop it: "
        "thousands of ranks holding a many-lane state (16,384 x 2,048 lanes) outgrow 24 GiB otherwise; the "
        "digests' CPU then falls inside the round",
    )
    ap.add_argument(
        "--dir", default=None, help="the aggregate folder (local backend); default bench/.work/aggregate-scale"
    )
    return ap.parse_args(argv)


def report(res: dict[str, Any]) -> str:
    head = (
        f"{res['ranks']} ranks ({res['mode']} in {res['processes']} processes; tp={res['tp']} pp={res['pp']} "
        f"cp={res['cp']} dp={res['dp']}, "
        f"{res['lanes']} lanes, fan-in {res['fan_in']}) on {res['backend']}"
        + (f" +{res['latency_ms']:g} ms/request" if res["backend"] == "s3" else "")
        + f", {res['cpus']} CPUs, load {res['loadavg'][0]:.1f}"
    )
    lines = [head]
    for r in res["rounds"]:
        if r["error_count"]:
            lines.append(f"  round {r['round']}: {r['error_count']} errors, e.g. {r['errors'][:1]}")
            continue
        srv = r.get("server_requests_per_rank")
        lines.append(
            f"  round {r['round']}: {r['latency_s']:.2f} s (CPU {r['cpu_s']:.1f} s; all called by "
            f"{r['arrivals_s']:.2f} s, "
            f"leader done {r['leader_s']:.2f} s, half the ranks {r['returns_p50_s']:.2f} s), {r['writers']} "
            f"writers, {r['ops_per_rank_mean']:.2f} metadata ops/rank "
            f"(max {r['ops_per_rank_max']}), {r['bytes_read_per_rank']:.0f} B read + "
            f"{r['bytes_written_per_rank']:.0f} B written /rank, "
            f"identical={r['identical']}" + (f", server: {srv.get('requests', 0):.2f} requests/rank" if srv else "")
        )
    return "\n".join(lines)


if __name__ == "__main__":
    result = run(parse())
    print(report(result), file=sys.stderr)
    emit(result)
