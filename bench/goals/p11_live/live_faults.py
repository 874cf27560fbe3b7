"""P11: samples lost and repeated per fault under torchft, Zephon's live lanes beside torchft's own sampler.

    PYTHONPATH=.:bench python bench/goals/p11_live/live_faults.py [--quick] [--steps N] [--out FILE.json]

One fault script, run by real parts: torchft 0.2.0's lighthouse (in this process, on loopback, a
kernel-chosen port) and three replica groups as processes (``zephon_torchft.drill`` through
live_replica.py, one rank each, gloo over loopback, a tiny LM on CPU). Replica 1 is killed
at step 3 before the step's allreduce, replica 3 joins once step 4 has committed (its process
already started and waiting, so the join figure is the quorum's, the import time given apart),
replica 2 is killed at step 7 after the allreduce, before the commit. The same script runs with
``--loader zephon`` (12 lanes, 1 batch per lane per step) and ``--loader torchft-sampler``
(torchft's ``DistributedSampler``, 2 documents per replica group per step), in sync quorum and
in async quorum with ``init_sync=False`` (``--quick``: sync only).

What is counted, for both loaders alike, from the processes' attempt logs: a committed step's
samples are those of every participant of the attempt that committed (a replica killed after the
allreduce included: its gradient is in the step); a sample is *lost* when an attempt drew it and
no committed step holds it, *repeated* for every committed step beyond the first that holds it.
For Zephon each committed step is also compared with an uninterrupted run's. Prints one
``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from measure import emit

from zephon_dev.torchft_drill import Replica
from zephon_dev.torchft_drill import launch as drill_launch
from zephon_torchft.drill_log import committed_steps, read_log, sample_key

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
PACE = 0.15  # seconds each replica sleeps after an attempt, so that the faults land in the order scripted
#: (replica id, released once this step has committed (None: at the start), killed at step, where)
SCRIPT = [(0, None, None, ""), (1, None, 3, "before_allreduce"), (2, None, 7, "after_allreduce"), (3, 4, None, "")]
WINDOWS = {"kill before the allreduce": (3, 4), "join": (4, 7), "kill after the allreduce, before the commit": (7, 8)}
MODES = {"sync": ["--mode", "sync"], "async": ["--mode", "async"]}
LOADERS = {"zephon": ["--canonical-replicas", "12", "--batches-per-lane", "1"],
           "torchft-sampler": ["--batches-per-lane", "1", "--max-groups", "8"]}


def launch(folder: Path, loader: str, mode: str, steps: int, timeout_s: int) -> dict[str, Any]:
    """The fault script once: every replica's log lines, times, exit status; the joiner's launch and release."""
    shutil.rmtree(folder, ignore_errors=True)  # the drills append to their logs
    replicas = [Replica(rid, join_at, die_at, where or "before_allreduce") for rid, join_at, die_at, where in SCRIPT]
    args = ["--loader", loader, "--pace", str(PACE), "--deadline", str(timeout_s - 10), *MODES[mode], *LOADERS[loader]]
    run = drill_launch(folder, replicas, steps=steps, args=args, timeout_s=timeout_s,
                       program=[str(HERE / "live_replica.py")], durable=False, poll_s=0.02)
    return {"logs": run.logs, "times": {r: _times(folder / f"r{r}.jsonl.times") for r in run.codes},
            "codes": run.codes, "popen_t": run.started_t,
            "release": {r: (t, run.released[r]) for r, t in run.released_t.items()}, "wall_s": run.wall_s,
            "stderr": {r: text[-600:] for r, text in run.stderr.items()}}


def _times(path: Path) -> dict[str, float]:
    return {k: v for line in read_log(path) for k, v in line.items()}


def accounting(logs: dict[int, list[dict]], steps: dict[int, list[Any]]) -> dict[str, Any]:
    """Lost (drawn by an attempt, in no committed step: counted at the step that first drew it) and repeated (in a
    committed step after an earlier one: counted there), overall and per fault window."""
    drawn: dict[Any, int] = {}
    for lines in logs.values():
        for line in lines:
            for s in line["samples"]:
                drawn[sample_key(s)] = min(drawn.get(sample_key(s), line["step"]), line["step"])
    held = Counter(s for samples in steps.values() for s in samples)
    lost_at = Counter(step for s, step in drawn.items() if s not in held)
    seen: set[Any] = set()
    repeated_at: Counter[int] = Counter()
    for step in sorted(steps):
        for s in steps[step]:
            if s in seen:
                repeated_at[step] += 1
            seen.add(s)

    def part(first: int, end: int) -> dict[str, Any]:
        sizes = [len(steps[s]) for s in range(first, end) if s in steps]
        return {"steps": [first, end - 1], "lost": sum(lost_at[s] for s in range(first, end)),
                "repeated": sum(repeated_at[s] for s in range(first, end)), "samples": sum(sizes),
                "per_step": [min(sizes), max(sizes)] if sizes else None}

    last = max(steps, default=0) + 1
    return {"all": part(0, last), "windows": {name: part(a, b) for name, (a, b) in WINDOWS.items()}}


def join_times(run: dict[str, Any]) -> dict[str, Any] | None:
    """The joiner's way in: process start -> ready (imports, data), release -> Manager -> first committed step."""
    rid = next(r for r, join_at, *_ in SCRIPT if join_at is not None)
    first = next((x for x in run["logs"][rid] if x["committed"] and "t" in x), None)
    times, rel = run["times"].get(rid, {}), run["release"].get(rid)
    if first is None or rel is None or "ready_t" not in times:
        return None
    out = {"ready_s": times["ready_t"] - run["popen_t"][rid], "release_to_commit_s": first["t"] - rel[0],
           "released_after_step": rel[1], "first_committed_step": first["step"],
           "attempts_before": sum(1 for x in run["logs"][rid] if x["t"] < first["t"])}
    if "manager_t" in times:
        out["quorum_to_commit_s"] = first["t"] - times["manager_t"]
    out["start_to_commit_s"] = out["ready_s"] + out["release_to_commit_s"]
    return out


def step_time(run: dict[str, Any]) -> dict[str, float] | None:
    """Replica 0's commits: the median interval (less the pace) and the longest one (a fault's stall)."""
    ts = [x["t"] for x in run["logs"][0] if x["committed"] and "t" in x]
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    if len(gaps) < 2:
        return None
    return {"median_s": statistics.median(gaps) - PACE, "longest_s": max(gaps) - PACE, "pace_s": PACE}


def reference(steps: int) -> dict[int, list[Any]]:
    """Zephon's uninterrupted run of the same recipe: each step's samples."""
    from zephon_core.live.simulate import reference_steps
    from zephon_torchft import drill

    r = drill.load(drill.parse_args(["--lighthouse", "-", "--replica-id", "0", "--steps", "1", "--log", "-",
                                     *LOADERS["zephon"]]))
    C = r.spec.canonical_replicas
    assert C is not None
    return reference_steps(lambda slots, slot: r.build_standalone(dp_degree=slots, dp_group_id=slot), C, 1, steps)


def measure(folder: Path, loader: str, mode: str, steps: int, timeout_s: int) -> dict[str, Any]:
    run = launch(folder / f"{mode}-{loader}", loader, mode, steps, timeout_s)
    committed, problems = committed_steps(run["logs"])
    died = {x["replica"]: [x["step"], x["died"]] for lines in run["logs"].values() for x in lines if x.get("died")}
    out = {"codes": run["codes"], "wall_s": run["wall_s"], "committed": sorted(committed), "problems": problems,
           "died": died, "discarded": sum(x["committed"] is False for lines in run["logs"].values() for x in lines),
           **accounting(run["logs"], committed), "join": join_times(run), "step": step_time(run)}
    if loader == "zephon":
        ref = reference(steps)
        out["differs_from_uninterrupted"] = sorted(s for s in ref if committed.get(s) != ref[s])
    if set(committed) != set(range(steps)):
        out["stderr"] = run["stderr"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="sync quorum only")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--work", default=str(ROOT / "bench" / ".work"), help="the drills' logs go to WORK/live")
    ap.add_argument("--timeout", type=int, default=150, help="seconds for one launch of the script")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    folder = Path(a.work) / "live"
    modes = ["sync"] if a.quick else list(MODES)
    res: dict[str, Any] = {"steps": a.steps, "script": SCRIPT, "windows": WINDOWS, "pace_s": PACE, "runs": {}}
    for mode in modes:
        for loader in LOADERS:
            x = measure(folder, loader, mode, a.steps, a.timeout)
            res["runs"].setdefault(mode, {})[loader] = x
            print(f"{mode} {loader}: lost {x['all']['lost']} repeated {x['all']['repeated']} "
                  f"committed {len(x['committed'])} wall {x['wall_s']} s", file=sys.stderr, flush=True)
    emit(res, a.out)


if __name__ == "__main__":
    main()
