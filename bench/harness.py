"""The driver's side of the bench: paths, the run log, and the Runner that starts every measurement.

Every measurement runs in a fresh subprocess of the interpreter that holds the loader under test:
``project`` (this checkout's venv: zephon_core, torchdata, megatron-core, the floors) or ``peers``
(bench/run.sh's venv: zephon 0.2.0, Grain, matplotlib, py-spy). ``Runner.case`` starts
``bench/cases.py CASE JSON``; ``Runner.script`` starts a goal's standalone script (``bench/goals/<goal>/*.py``).
Either prints ``RESULT <json>`` as its last such line, which comes back as a dict.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
WORK = BENCH / ".work"
RESULTS = BENCH / "results"
PARTIAL = RESULTS / "partial"  # runs of some goals, or quick ones (bench/run.py's outputs()); git ignores it
IMG = ROOT / "docs" / "img"
CASES = BENCH / "cases.py"
BASELINE = RESULTS / "baseline.json"  # an earlier run, for the "before" columns (see docs/performance.md)
SEQ_LEN, BATCH, SEED = 512, 8, 7

_LOG: list[TextIO] = []  # the run's log file, once main() opened it


def open_log(path: Path) -> None:
    _LOG[:] = [open(path, "w")]


def log(msg: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:5.1f}] {msg}"
    print(line, flush=True)
    for f in _LOG:
        f.write(line + "\n")
        f.flush()


def log_stderr(label: str, stderr: str) -> None:
    for f in _LOG:
        f.write(f"--- stderr of {label}\n{stderr[-4000:]}\n")


class Runner:
    """Starts measurements in the ``project`` or ``peers`` interpreter and reads back their RESULT line."""

    def __init__(self, project_py: str, peers_py: str | None) -> None:
        self.py = {"project": project_py, "peers": peers_py}

    def env(self, venv: str) -> dict[str, str]:
        env = dict(os.environ)
        # Same knobs for every loader: the loaders' own parallelism settings are what is measured.
        env.update(TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0",
                   PYTHONWARNINGS="ignore")
        # bench/ for a goal's own scripts (bench/goals/<goal>/), which import the shared modules (corpus, measure)
        # by name; in the project venv also zephon_core and zephon_dev (the S3 server and fault proxy, fsops,
        # torchft drills) from this checkout, and scripts/ (torchtitan_cpu, the CPU launches P12 times). The one
        # place bench/ reaches them, so no bench module edits sys.path.
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(BENCH), str(ROOT / "scripts")] if venv == "project"
                                            else [str(BENCH)])
        return env

    def case(self, venv: str, case: str, args: dict, timeout: float = 300.0, label: str = "") -> dict:
        """``bench/cases.py CASE JSON`` in the ``venv`` interpreter."""
        return self._run(venv, [str(CASES), case, json.dumps(args)], timeout, label or case)

    def script(self, venv: str, script: str, argv: list[str], timeout: float = 1800.0, label: str = "") -> dict:
        """A standalone script (a path relative to the repository root) with its command-line arguments."""
        return self._run(venv, [str(ROOT / script), *argv], timeout, label or script)

    def _run(self, venv: str, argv: list[str], timeout: float, label: str) -> dict:
        py = self.py[venv]
        if py is None:
            return {"error": f"no {venv} interpreter"}
        t0 = time.perf_counter()
        load0 = os.getloadavg()[0]
        try:
            p = subprocess.run([py, *argv], cwd=ROOT, env=self.env(venv), capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired as e:
            log(f"  {label}: TIMEOUT after {timeout:.0f}s")
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else str(e.stderr or "")
            return {"error": f"timeout after {timeout:.0f}s", "stderr": err[-2000:]}
        wall = time.perf_counter() - t0
        if p.stderr.strip():
            log_stderr(label, p.stderr)
        for line in reversed(p.stdout.splitlines()):
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
                res["wall_s"] = wall
                res["load_start"] = load0
                return res
        log(f"  {label}: FAILED (exit {p.returncode})")
        return {"error": f"exit {p.returncode}", "stderr": p.stderr[-3000:]}


@dataclass
class Context:
    """What a goal's ``run`` gets: the runner, the corpus arguments every case starts from, the options."""

    runner: Runner
    base: dict[str, Any]  # corpus paths, index cache, seed, seq_len, batch (bench/cases.py prepare)
    quick: bool = False
    rounds: int = 3
    only: set[str] = field(default_factory=set)
    s3rver: str | None = None  # s3rver's bin/s3rver.js (P4's second loopback S3 server), if installed
    work: Path = WORK
    results: Path = RESULTS  # where files beside results.json go (profiles): a partial run's own folder


def med(xs: list[float | None]) -> float | None:
    ys = [x for x in xs if x is not None]
    return statistics.median(ys) if ys else None


def fmt(x: Any, spec: str = ".1f") -> str:
    if x is None:
        return "n/a"
    return format(x, spec)


def without_timing(res: dict) -> dict:
    """A case's result without the Runner's wall time and start load (for comparing or storing)."""
    res.pop("wall_s", None)
    res.pop("load_start", None)
    return res
