"""Real torchft drills: replica-group processes (``python -m zephon_torchft.drill``) around an in-process lighthouse;
their logs are read back by ``zephon_torchft.drill_log`` (``committed_steps``). The reliability tests and the
bench's P11 (bench/goals/p11_live/live_faults.py) launch them here."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zephon_torchft.drill_log import read_log

REPO = Path(__file__).resolve().parents[2]
Sample = tuple[int, int, str]


@dataclass(frozen=True)
class Replica:
    """One replica-group process: launched at once, or released when a step ``>= join_at`` has committed."""

    rid: int
    join_at: int | None = None
    die_at: int | None = None
    die_when: str = "before_allreduce"
    extra: tuple[str, ...] = ()


@dataclass
class Drill:
    """What the processes of one launch logged and how they ended."""

    logs: dict[int, list[dict[str, Any]]]
    codes: dict[int, int | None]
    stderr: dict[int, str]
    wall_s: float
    durable: Path
    released: dict[int, int] = field(default_factory=dict)
    """The committed step at which each joiner was released."""
    started_t: dict[int, float] = field(default_factory=dict)
    """Each process's start, and each joiner's release, as ``time.time()`` (the bench's join figure)."""
    released_t: dict[int, float] = field(default_factory=dict)

    def tail(self) -> str:
        return "\n".join(f"--- replica {r} (exit {self.codes[r]}):\n" + "\n".join(t.splitlines()[-6:])
                         for r, t in sorted(self.stderr.items()))


DRILL = ("-m", "zephon_torchft.drill")


def launch(tmp: Path, replicas: Sequence[Replica], *, steps: int, args: Sequence[str] = (), min_replicas: int = 2,
           timeout_s: float = 120.0, program: Sequence[str] = DRILL, durable: bool = True,
           poll_s: float = 0.1) -> Drill:
    """Run ``replicas`` against a fresh lighthouse until every process ends (or ``timeout_s``).

    ``program``: what each replica runs with the drill's arguments (the bench's timing wrapper of the drill);
    ``durable``: whether the drill writes durable checkpoints (under ``tmp/durable``); ``poll_s``: how often the
    joiners' release condition is checked (the bench times joins, so it polls more often).
    """
    from torchft.coordination import LighthouseServer

    tmp.mkdir(parents=True, exist_ok=True)
    path = [str(REPO), str(REPO / "integrations" / "torchft"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": os.pathsep.join(path)}
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=min_replicas, join_timeout_ms=400, quorum_tick_ms=50,
                                  heartbeat_timeout_ms=2000)
    procs: dict[int, subprocess.Popen[bytes]] = {}
    start = time.monotonic()
    run = Drill({}, {}, {}, 0.0, tmp / "durable")
    try:
        for r in replicas:
            cmd = ["timeout", "-k", "5", str(int(timeout_s)), sys.executable, *program,
                   "--lighthouse", lighthouse.address(), "--replica-id", str(r.rid), "--steps", str(steps),
                   "--log", str(tmp / f"r{r.rid}.jsonl"), *(["--durable", str(run.durable)] if durable else []),
                   "--min-replicas", str(min_replicas), "--start-when", str(tmp / f"go-{r.rid}"), *args, *r.extra]
            if r.die_at is not None:
                cmd += ["--die-at", str(r.die_at), "--die-when", r.die_when]
            if r.join_at is None:
                (tmp / f"go-{r.rid}").touch()
            run.started_t[r.rid] = time.time()
            with open(tmp / f"r{r.rid}.err", "wb") as err:
                procs[r.rid] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _release_joiners(tmp, replicas, procs, run, start + timeout_s + 10, poll_s)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        lighthouse.shutdown()
    run.logs = {r.rid: read_log(tmp / f"r{r.rid}.jsonl") for r in replicas}
    run.codes = {rid: p.returncode for rid, p in procs.items()}
    run.stderr = {r.rid: (tmp / f"r{r.rid}.err").read_text(errors="replace") for r in replicas}
    run.wall_s = round(time.monotonic() - start, 1)
    return run


def _release_joiners(tmp: Path, replicas: Sequence[Replica], procs: dict[int, subprocess.Popen[bytes]],
                     run: Drill, deadline: float, poll_s: float) -> None:
    """Touch each joiner's start file once a step ``>= join_at`` has committed; return when every process ended."""
    waiting = [r for r in replicas if r.join_at is not None]
    while any(p.poll() is None for p in procs.values()) and time.monotonic() < deadline:
        if waiting:
            logged = [line for r in replicas for line in read_log(tmp / f"r{r.rid}.jsonl")]
            done = max((line["step"] for line in logged if line["committed"]), default=-1)
            for r in [r for r in waiting if done >= (r.join_at or 0)]:
                (tmp / f"go-{r.rid}").touch()
                run.released_t[r.rid] = time.time()
                run.released[r.rid] = done
                waiting.remove(r)
        time.sleep(poll_s)


def loss_counts(steps: dict[int, list[Sample]], reference: dict[int, list[Sample]]) -> tuple[int, int, int]:
    """``(samples expected, lost, repeated)`` of the committed steps against the reference steps."""
    got = Counter(s for samples in steps.values() for s in samples)
    want = Counter(s for samples in reference.values() for s in samples)
    lost = sum((want - got).values())
    return sum(want.values()), lost, sum(n - 1 for n in got.values() if n > 1)
