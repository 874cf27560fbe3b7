"""Profiles of zephon_core's hot paths (py-spy, all threads): P1's tokenize pipeline, P2's Megatron one, P3's restore.

Not a goal with targets: a stage with a section of results.md and files ``bench/results/profile_*.txt``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from goal import Goal, no_verdicts
from harness import CASES, ROOT, Context, Runner, log
from loaders.zephon_core import pretok_pipeline, tokenize_pipeline
from measure import emit, perf

# Leaf frames of threads that are blocked, not working (this VM's py-spy does not always detect idle
# threads itself): waits on locks/queues/conditions, the pool's work queue, stdin (the target's _ready),
# and the prefetch thread waiting for a free slot (C-level SimpleQueue.get, so the Python leaf is
# _take_slot itself; counted as busy up to the run of 2026-11-29 09:32).
IDLE_LEAVES = ("Condition.wait ", "_worker (thread.py)", "_ready (profiles.py)", "Thread._wait_for_tstate_lock",
               "Event.wait ", "_Engine._take_slot ")


def _ready() -> None:
    """Tell the driver the workload is set up, and wait for its go (py-spy attaches meanwhile)."""
    print("READY", flush=True)
    sys.stdin.readline()


def _batches(p: Any, warm: int, a: dict) -> str:
    it = iter(p)
    for _ in range(warm):
        next(it)
    _ready()
    t0 = perf()
    for _ in range(a["batches"]):
        next(it)
    p.close()
    return f"{a['batches'] / (perf() - t0):.1f} batches/s under the profiler"


def _restores(a: dict) -> str:
    p = tokenize_pipeline(a, 1)
    it = iter(p)
    for _ in range(a["late"]):
        next(it)
    st = json.loads(json.dumps(p.checkpoint()))
    p.close()
    _ready()
    t0 = perf()
    for _ in range(a["reps"]):
        q = tokenize_pipeline(a, 1)
        q.restore(st)
        next(iter(q))
        q.close()
    return (f"restore -> first batch: {(perf() - t0) / a['reps'] * 1e3:.1f} ms each (pipeline build included) "
            "under the profiler")


WORKLOADS: dict[str, Callable[[dict], str]] = {
    "p1": lambda a: _batches(tokenize_pipeline(a, 1), 3, a),
    "p1_sync": lambda a: _batches(tokenize_pipeline(a, 1, prefetch=0, reader_threads=0), 3, a),
    "p2": lambda a: _batches(pretok_pipeline(a, "megatron"), 10, a),
    "p3": _restores,
}


def case_profile_target(a: dict) -> None:
    """Workload for the profile stage: set up, print READY, wait for a line on stdin, run the measured part, exit."""
    if a["what"] not in WORKLOADS:
        raise SystemExit(a["what"])
    emit({"note": WORKLOADS[a["what"]](a)})


def _short(frame: str) -> str:
    # "func (path/to/file.py)" -> "func (file.py)" keeping zephon_core's package path
    if "(" in frame and frame.endswith(")"):
        fn, _, path = frame[:-1].partition(" (")
        p = path.split("/site-packages/")[-1]
        if "zephon_core/" in p:
            p = "zephon_core/" + p.split("zephon_core/")[-1]
        elif "/" in p:
            p = p.rsplit("/", 1)[-1]
        return f"{fn} ({p})"
    return frame


def summarize_pyspy(raw: Path, top: int = 14) -> dict:
    self_c: Counter = Counter()
    incl_c: Counter = Counter()
    total = idle = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = [f.strip() for f in stack.split(";") if f.strip()]
        frames = [f for f in frames if not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        if _short(frames[-1]).startswith(IDLE_LEAVES):
            idle += int(n)
            continue
        total += int(n)
        self_c[_short(frames[-1])] += int(n)
        for f in set(_short(x) for x in frames):
            incl_c[f] += int(n)
    return {
        "samples": total,
        "idle_samples_dropped": idle,
        "self": [(f, round(100 * c / max(total, 1), 1)) for f, c in self_c.most_common(top)],
        "inclusive": [(f, round(100 * c / max(total, 1), 1)) for f, c in incl_c.most_common(top + 10)],
    }


def _pyspy(r: Runner) -> str | None:
    cand = Path(r.py["peers"]).parent / "py-spy" if r.py["peers"] else None
    return str(cand) if cand is not None and cand.exists() else shutil.which("py-spy")


def _record(r: Runner, pyspy: str, args: dict, raw: Path) -> str:
    """Start the target, attach py-spy once it is set up (so the profile holds only the measured part), run it."""
    tgt = subprocess.Popen([r.py["project"], str(CASES), "profile_target", json.dumps(args)], cwd=ROOT,
                           env=r.env("project"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    spy = None
    try:
        assert tgt.stdout is not None and tgt.stdin is not None
        line = tgt.stdout.readline()
        if line.strip() != "READY":
            raise RuntimeError(f"target did not get ready: {line!r} {tgt.stderr.read()[-800:] if tgt.stderr else ''}")
        record = [pyspy, "record", "--nolineno", "-r", "200", "-f", "raw", "-o", str(raw), "--pid", str(tgt.pid)]
        spy = subprocess.Popen(record, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        tgt.stdin.write("go\n")
        tgt.stdin.flush()
        stdout, _ = tgt.communicate(timeout=300)
        spy.communicate(timeout=60)
        return stdout
    except Exception:
        for pr in (tgt, spy):
            if pr is not None and pr.poll() is None:
                pr.kill()
        raise


def _write(out: Path, name: str, s: dict, args: dict) -> None:
    with open(out / f"profile_{name}.txt", "w") as f:
        f.write(f"py-spy record -r 200 --nolineno --pid (all threads): {s['samples']} busy samples "
                f"({s['idle_samples_dropped']} samples of blocked threads dropped)\n")
        shown = {k: v for k, v in args.items() if k in ("what", "batches", "late", "reps")}
        f.write("workload: bench/cases.py profile_target " + json.dumps(shown) + "\n")
        for ln in s["note"]:
            f.write(ln + "\n")
        f.write("\nself time (% of samples):\n")
        for fn, pct in s["self"]:
            f.write(f"  {pct:5.1f}%  {fn}\n")
        f.write("\ninclusive time (% of samples):\n")
        for fn, pct in s["inclusive"]:
            f.write(f"  {pct:5.1f}%  {fn}\n")


def _profile(r: Runner, pyspy: str, name: str, args: dict, out: Path) -> dict:
    raw = out / f"profile_{name}.raw"
    raw.unlink(missing_ok=True)
    t0 = time.perf_counter()
    try:
        stdout = _record(r, pyspy, args, raw)
    except Exception as e:  # noqa: BLE001
        log(f"  profile {name}: FAILED {e!r}"[:300])
        return {"error": repr(e)[-1500:]}
    if not raw.exists():
        log(f"  profile {name}: FAILED (no py-spy output)")
        return {"error": "py-spy wrote nothing"}
    s = summarize_pyspy(raw)
    s["wall_s"] = time.perf_counter() - t0
    s["note"] = [json.loads(ln[7:]).get("note", "") for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    _write(out, name, s, args)
    raw.unlink()
    log(f"  profile {name}: {s['samples']} samples; {s['note'][0] if s['note'] else ''}; top self: "
        + "; ".join(f"{fn} {pct}%" for fn, pct in s["self"][:3]))
    return s


def run(ctx: Context) -> dict:
    pyspy = _pyspy(ctx.runner)
    if pyspy is None:
        return {"error": "py-spy not found"}
    q, base = ctx.quick, ctx.base
    targets = [
        ("p1_tokenize", {**base, "what": "p1", "batches": 40 if q else 150}),
        ("p1_tokenize_sync", {**base, "what": "p1_sync", "batches": 40 if q else 150}),
        ("p2_megatron", {**base, "what": "p2", "batches": 300 if q else 1500}),
        ("p3_restore", {**base, "what": "p3", "late": 20 if q else 60, "reps": 4 if q else 12}),
    ]
    return {name: _profile(ctx.runner, pyspy, name, args, ctx.results) for name, args in targets}


def section(R: dict, B: dict) -> list[str]:
    if "profiles" not in R or "error" in R["profiles"]:
        return []
    L = ["## Profiles (py-spy, zephon_core, all threads)\n"]
    for name, s in R["profiles"].items():
        if "error" in s:
            L.append(f"- {name}: error")
            continue
        L.append(f"**{name}** ({s['samples']} samples{'; ' + s['note'][0] if s.get('note') else ''}): self time "
                 + ", ".join(f"`{fn}` {pct}%" for fn, pct in s["self"][:6]) + "  ")
        incl = [(fn, pct) for fn, pct in s["inclusive"] if "zephon_core/" in fn][:6]
        L.append("inclusive (zephon_core): " + ", ".join(f"`{fn}` {pct}%" for fn, pct in incl) + "\n")
    return L


GOAL = Goal("profile", "profiles (py-spy)", {}, no_verdicts, section, run=run,
            cases={"profile_target": case_profile_target}, result_key="profiles")
