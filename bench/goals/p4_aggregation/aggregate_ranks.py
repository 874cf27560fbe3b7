"""P4's case: checkpoint aggregation latency with one real (forked) process per rank, for several world sizes.

``python bench/cases.py aggregate '{"backend": "local", "ranks": [2, 8, 64], "rounds": 5, "local_dir": DIR}'``;
``backend``: ``local`` (a folder, ``local_dir``), ``s3`` (moto's server, the tests' one) or ``s3rver`` (the node
server at ``s3rver``, objects under ``local_dir``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

from measure import emit, perf

OPS = ("get", "put", "names", "remove", "get_many")


def _timed(stats: dict[str, list], name: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kw: Any) -> Any:
        t = perf()
        try:
            return fn(*args, **kw)
        finally:
            st = stats.setdefault(name, [0, 0.0])
            st[0] += 1
            st[1] += perf() - t

    return wrapper


def _agg_rank(base: str, run_id: str, n: int, r: int, state: dict, so: dict, rounds: int, barrier: Any, q: Any) -> None:
    try:
        from zephon_core.checkpoint.aggregate import Aggregator

        agg = Aggregator(base, run_id, n, r, 120.0, so)
        stats: dict[str, list] = {}
        # Trace where a round's time goes (store calls vs sleeping between polls); the
        # wrappers only count and time the calls, they change nothing.
        for name in OPS:
            setattr(agg.dir, name, _timed(stats, name, getattr(agg.dir, name)))
        time.sleep = _timed(stats, "sleep", time.sleep)
        for k in range(rounds):
            barrier.wait()
            stats.clear()
            t0 = perf()
            merged = agg.checkpoint(state)
            t1 = perf()
            q.put((k, r, t0, t1, len(merged["lanes"]), None, {kk: list(v) for kk, v in stats.items()}))
    except BaseException as e:  # reported, never hangs the parent
        q.put((-1, r, 0.0, 0.0, 0, repr(e), {}))
        barrier.abort()
    finally:
        os._exit(0)


def _store_latency(base: str, so: dict, n: int = 15) -> dict:
    """Median latency of single store calls as the Aggregator makes them (calibration, after the runs)."""
    from zephon_core.checkpoint.folder import AggregateFolder

    d = AggregateFolder(base, "calibration", so)
    payload = json.dumps({"x": "y" * 300}).encode()
    ts: dict[str, list[float]] = {"write (atomic publish)": [], "read": [], "names (list)": [], "remove (1 file)": []}
    for i in range(n):
        for op, fn in (
            ("write (atomic publish)", lambda: d.put(f"f{i}.json", payload)),
            ("read", lambda: d.get(f"f{i}.json")),
            ("names (list)", lambda: d.names()),
            ("remove (1 file)", lambda: d.remove([f"f{i}.json"])),
        ):
            t0 = perf()
            fn()
            ts[op].append(perf() - t0)
    return {op: statistics.median(v) * 1e3 for op, v in ts.items()}


def _store(a: dict) -> tuple[Any, dict, str]:
    """The backend's server (or None), its storage options and the aggregation folder's URL."""
    backend = a["backend"]
    if backend == "s3":
        import s3fs  # noqa: F401

        from zephon_dev.s3_server import S3Server

        server = S3Server(bucket="zephon-bench", mode="process")
        ep = server.start()
        return server, ep.storage_options, ep.url("aggregate")
    if backend == "s3rver":
        import s3fs  # noqa: F401

        from zephon_dev.s3rver import S3rver

        s3rver = S3rver(a["s3rver"], a["local_dir"], bucket="zephon-bench")
        return s3rver, s3rver.storage_options, s3rver.url("aggregate")
    os.makedirs(a["local_dir"], exist_ok=True)
    return None, {}, a["local_dir"]


def _rounds(base: str, n: int, so: dict, rounds: int) -> tuple[list[list[tuple]], list[str], float]:
    """``rounds`` checkpoints by ``n`` forked ranks: each round's per-rank records, errors, the wall time."""
    import multiprocessing as mp
    import uuid

    import numpy as np

    from zephon_core import MemorySource, Pipeline, StaticMixture

    src = MemorySource([np.arange(40) + i for i in range(256)])
    run_id = f"bench-{n}-{uuid.uuid4().hex[:8]}"
    proto = Pipeline(StaticMixture([src], seed=1, chunk_size=4)).pack(32).batch(2)
    states = [proto.options(world_size=n, global_rank=r, canonical_replicas=n, aggregate_dir=base, run_id=run_id)
              .local_state() for r in range(n)]
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(n + 1)
    q = ctx.SimpleQueue()
    procs = [ctx.Process(target=_agg_rank, args=(base, run_id, n, r, states[r], so, rounds, barrier, q), daemon=True)
             for r in range(n)]
    t_spawn = perf()
    for pr in procs:
        pr.start()
    rows: list[list[tuple]] = [[] for _ in range(rounds)]
    errors: list[str] = []
    for _k in range(rounds):
        try:
            barrier.wait(timeout=180)
        except Exception:
            errors.append("barrier broken")
            break
        for _ in range(n):
            item = q.get()
            if item[5] is not None:
                errors.append(f"rank {item[1]}: {item[5]}")
                break
            rows[item[0]].append(item)
        if errors:
            break
    for pr in procs:
        pr.join(timeout=30)
    return rows, errors, perf() - t_spawn


def _trace(rs: list[tuple], leader: bool) -> dict:
    sel = [x[6] for x in rs if (x[1] == 0) == leader]
    return {op: {"calls": sum(d.get(op, [0, 0])[0] for d in sel) / len(sel),
                 "ms": sum(d.get(op, [0, 0])[1] for d in sel) / len(sel) * 1e3}
            for op in sorted({op for d in sel for op in d})}


def _summary(rows: list[list[tuple]], n: int) -> dict:
    lat = [max(r[3] for r in rs) - min(r[2] for r in rs) for rs in rows]
    leader = [next(r for r in rs if r[1] == 0) for rs in rows]
    last = rows[-1]
    return {
        "trace_last_round": {"leader": _trace(last, True), "follower_mean": _trace(last, False) if n > 1 else {}},
        "first_round_ms": lat[0] * 1e3,
        "warm_ms": statistics.median(lat[1:]) * 1e3 if len(lat) > 1 else lat[0] * 1e3,
        "rounds_ms": [x * 1e3 for x in lat],
        "leader_warm_ms": statistics.median([(r[3] - r[2]) for r in leader[1:]]) * 1e3 if len(leader) > 1 else None,
        "merged_lanes": rows[0][0][4],
    }


def case_aggregate(a: dict) -> None:
    """Aggregation latency per world size in ``a["ranks"]``, ``a["rounds"]`` rounds each, then single-call latencies."""
    from zephon_core.checkpoint.aggregate import Aggregator  # noqa: F401  (imported before fork)

    server, so, base = _store(a)
    out: dict[str, Any] = {"backend": a["backend"], "per_ranks": {}}
    try:
        for n in a["ranks"]:
            rows, errors, wall = _rounds(base, n, so, a["rounds"])
            res: dict[str, Any] = {"spawn_s": wall, "errors": errors}
            if not errors:
                res.update(_summary(rows, n))
            out["per_ranks"][str(n)] = res
            print(f"# {a['backend']} ranks={n}: {res.get('warm_ms', errors)}", file=sys.stderr, flush=True)
        out["store_latency_ms"] = _store_latency(base, so)
    finally:
        if server is not None:
            server.stop()
    out["loadavg"] = os.getloadavg()
    emit(out)
