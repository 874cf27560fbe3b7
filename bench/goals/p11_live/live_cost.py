"""P11: what live mode costs per step: the table's bytes, its in-process work, and its allreduce among 3 processes.

    PYTHONPATH=.:bench python bench/goals/p11_live/live_cost.py [--quick] [--steps N] [--out FILE.json]

For each configuration (lanes in all, data-parallel ranks per replica group, i.e. slots) three replica
groups hold ``LiveLanes`` of slot 0 over the drill's recipe (bundled demo corpus, seq_len 32, batch 2,
1 batch per lane per step) and run committed steps in one process. Timed per replica and step:
``exchange()`` (its lanes' positions into the int64 table) + ``problems()`` (the summed table checked)
+ ``settle()`` (the table adopted); cutting the batches (``begin``) is the loading any loader does and
is left out, as is the sum itself, which the allreduce does. Then three processes on loopback (gloo
through ``torch.distributed``, a FileStore: no port chosen by hand) SUM-allreduce a table of each
configuration's shape, a barrier before each call; the figure is the slowest rank's median (and the same for
one int64: the latency floor of any collective on the machine).

``table_bytes`` is what each replica sends per step: ``8 x (1 + lanes per slot) x (12 + 2 x stages x
sources)`` (14 int64 per lane for this one-source recipe). Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from measure import emit

ROOT = Path(__file__).resolve().parents[3]
REPLICAS = 3
#: name -> (canonical_replicas, data-parallel ranks per replica group)
CONFIGS = {"12 lanes (the drill's)": (12, 1), "8 lanes": (8, 1), "256 lanes": (256, 1), "4096 lanes": (4096, 1),
           "4096 lanes, 8 ranks per group (512 per slot)": (4096, 8)}


def recipe(lanes: int) -> Any:
    from zephon_torchft import drill

    return drill.load(drill.parse_args(["--lighthouse", "-", "--replica-id", "0", "--steps", "1", "--log", "-",
                                        "--canonical-replicas", str(lanes)]))


def in_process(lanes: int, slots: int, steps: int) -> dict[str, Any]:
    """Three replica groups' live lanes of slot 0 through ``steps`` committed steps; microseconds per replica."""
    import numpy as np

    from zephon_core.live import LiveLanes

    r = recipe(lanes)
    group = [LiveLanes(r.build_standalone(dp_degree=slots, dp_group_id=0), 1) for _ in range(REPLICAS)]
    parts: dict[str, list[float]] = {"exchange": [], "problems": [], "settle": []}
    try:
        for _ in range(steps + 1):  # the first step warms up
            for i, live in enumerate(group):
                live.begin(REPLICAS, i)
            tables, spent = [], {k: 0.0 for k in parts}
            for live in group:
                t = time.perf_counter()
                tables.append(live.exchange())
                spent["exchange"] += time.perf_counter() - t
            summed = np.sum(tables, axis=0)
            for live in group:
                t = time.perf_counter()
                assert live.problems(summed, REPLICAS) == []
                spent["problems"] += time.perf_counter() - t
                t = time.perf_counter()
                assert live.settle(summed, REPLICAS, True)
                spent["settle"] += time.perf_counter() - t
            for k, v in spent.items():
                parts[k].append(v / REPLICAS * 1e6)
    finally:
        for live in group:
            live.close()
    us = {k: statistics.median(v[1:]) for k, v in parts.items()}
    return {"lanes": lanes, "slots": slots, "lanes_per_slot": lanes // slots, "table_bytes": group[0].table_bytes,
            "shape": list(tables[0].shape), "in_process_us": sum(us.values()), "parts_us": us, "steps": steps}


def worker(rank: int, store: str, shapes: dict[str, list[int]], calls: int) -> None:
    """One of the three allreduce processes: prints its median microseconds per shape (JSON)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(store, REPLICAS), rank=rank, world_size=REPLICAS)
    out = {}
    for name, shape in shapes.items():
        t = torch.ones(shape, dtype=torch.int64)
        times = []
        for i in range(calls + 5):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            if i >= 5:
                times.append((time.perf_counter() - t0) * 1e6)
        out[name] = statistics.median(times)
    dist.destroy_process_group()
    print(json.dumps(out), flush=True)


def allreduce(shapes: dict[str, list[int]], calls: int) -> dict[str, float]:
    """The slowest rank's median microseconds per SUM allreduce of each shape among 3 processes."""
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
        cmd = ["timeout", "-k", "5", "300", sys.executable, __file__, "--worker", "RANK", "--store", store,
               "--shapes", json.dumps(shapes), "--calls", str(calls)]
        procs = [subprocess.Popen([str(rank) if c == "RANK" else c for c in cmd], env=env, stdout=subprocess.PIPE,
                                  text=True) for rank in range(REPLICAS)]
        outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"allreduce workers failed: exit {[p.returncode for p in procs]}")
    ranks = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    return {name: max(r[name] for r in ranks) for name in shapes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 steps, 30 allreduces per shape")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--work", default=None, help="unused (the bench's common argument)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--shapes", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--calls", type=int, default=200, help="allreduces timed per shape")
    a = ap.parse_args()
    if a.worker is not None:
        worker(a.worker, a.store, json.loads(a.shapes), a.calls)
        return
    steps = a.steps or (3 if a.quick else 8)
    calls = 30 if a.quick else a.calls
    res: dict[str, Any] = {"replicas": REPLICAS, "configs": {}}
    for name, (lanes, slots) in CONFIGS.items():
        res["configs"][name] = in_process(lanes, slots, steps)
        print(f"{name}: {res['configs'][name]['in_process_us']:.0f} us in process", file=sys.stderr, flush=True)
    us = allreduce({"floor (one int64)": [1], **{name: c["shape"] for name, c in res["configs"].items()}}, calls)
    for name, c in res["configs"].items():
        c["allreduce_us"] = us[name]
        c["total_us"] = c["in_process_us"] + us[name]
    res["allreduce"] = {"backend": "gloo (torch.distributed), 3 processes on loopback", "calls": calls,
                        "floor_us": us["floor (one int64)"]}
    emit(res, a.out)


if __name__ == "__main__":
    main()
