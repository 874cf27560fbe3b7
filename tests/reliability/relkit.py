"""Shared pieces of the reliability tests.

* A corpus whose rows name their origin: token ``j`` of document ``d`` is
  ``d * 1000 + j`` and every delivered row is identified by its provenance
  (source, document, token range of each stretch), so a test can count lost
  and duplicated samples without trusting the code under test.
* The global step of a batch is ``lane_index // M`` (``M`` batches per lane per
  optimizer step), which does not depend on the topology: runs on different
  numbers of data-parallel groups are compared step by step.
* ``run_ranks`` starts real rank processes (``rank_worker.py``, forked from a
  pre-imported ``zygote.py``) and collects what each one reports; a rank may be told to die (SIGKILL) at a chosen point.

This module imports only zephon_core (no torch), so rank processes start fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WORKER = HERE / "rank_worker.py"

#: Lanes of every run in this folder, batches of each lane per optimizer step.
C = 4
M = 1
SEQ_LEN = 12
BATCH = 2
N_DOCS = 600


def _doc(d: int) -> list[int]:
    return [d * 1000 + j for j in range(1 + (d * 7919 + 13) % 29)]


def work_source(seed: int = 7, name: str = "corpus"):
    from zephon_core import MemorySource, StaticMixture

    return StaticMixture([MemorySource([_doc(d) for d in range(N_DOCS)], name=name)], seed=seed, chunk_size=6)


def pipeline(seed: int = 7, *, shuffle_window: int = 0, **options: Any):
    from zephon_core import Pipeline

    p = Pipeline(work_source(seed)).pack(SEQ_LEN)
    if shuffle_window:
        p = p.shuffle(shuffle_window, seed=3)
    options.setdefault("canonical_replicas", C)
    options.setdefault("prefetch", 1)
    return p.batch(BATCH).options(**options)


def row_ids(batch: Any) -> list[str]:
    """One identity per row: the stretches of documents it holds."""
    return [";".join(f"{s.source}.{s.document}.{s.start}-{s.stop}" for s in segs) for segs in batch.provenance]


def batch_record(batch: Any) -> dict[str, Any]:
    return {"lane": batch.lane, "lane_index": batch.lane_index, "rows": row_ids(batch)}


def step_of(record: Mapping[str, Any], m: int = M) -> int:
    return int(record["lane_index"]) // m


def reference(steps: int, seed: int = 7, shuffle_window: int = 0) -> dict[int, Counter]:
    """Rows of each global step of an uninterrupted single-group run."""
    p = pipeline(seed, shuffle_window=shuffle_window, prefetch=0)
    it = iter(p)
    out: dict[int, Counter] = {}
    for _ in range(steps * C * M):
        rec = batch_record(next(it))
        out.setdefault(step_of(rec), Counter()).update(rec["rows"])
    p.close()
    return out


def by_step(records: Iterable[Mapping[str, Any]], upto: int | None = None) -> dict[int, Counter]:
    out: dict[int, Counter] = {}
    for rec in records:
        s = step_of(rec)
        if upto is None or s < upto:
            out.setdefault(s, Counter()).update(rec["rows"])
    return out


def compare(got: Mapping[int, Counter], ref: Mapping[int, Counter]) -> tuple[int, int, int]:
    """(rows checked, rows lost, rows duplicated or foreign), step by step."""
    checked = lost = dup = 0
    for s in set(ref) | set(got):
        r, g = ref.get(s, Counter()), got.get(s, Counter())
        checked += sum(r.values())
        lost += sum((r - g).values())
        dup += sum((g - r).values())
    return checked, lost, dup


# -- rank processes ------------------------------------------------------------
def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO), str(REPO / "integrations" / "torchtitan"), str(REPO / "integrations" / "megatron"), str(HERE)]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    env.update(extra or {})
    return env


def rank_config(
    workdir: Path,
    *,
    agg: str,
    run_id: str,
    world_size: int,
    rank: int,
    segments: Sequence[int],
    dp_degree: int | None = None,
    dp_group_id: int | None = None,
    seed: int = 7,
    timeout_s: float = 60.0,
    restore: str | None = None,
    fault: Mapping[str, Any] | None = None,
    gate: Mapping[str, Any] | None = None,
    observe_round: str | None = None,
    observe_write: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    tag: str = "",
    barrier: bool = True,
    step_barrier: bool = True,
    fan_in: int | None = None,
) -> dict[str, Any]:
    """What one rank process does: ``segments[k]`` batches, then checkpoint ``k``."""
    name = f"{tag or run_id}-r{rank}"
    bdir = workdir / f"{tag or run_id}-barrier"
    bdir.mkdir(exist_ok=True)
    return {
        "agg": agg,
        "run_id": run_id,
        "world_size": world_size,
        "rank": rank,
        "dp_degree": world_size if dp_degree is None else dp_degree,
        "dp_group_id": rank if dp_group_id is None else dp_group_id,
        "segments": list(segments),
        "seed": seed,
        "timeout_s": timeout_s,
        "restore": restore,
        "fault": dict(fault) if fault else None,
        "gate": dict(gate) if gate else None,
        "observe_round": observe_round,
        "observe_write": observe_write,
        "barrier": {"dir": str(bdir), "n": world_size} if barrier else None,
        "step_barrier": step_barrier,
        "fan_in": fan_in,
        "storage_options": dict(storage_options) if storage_options else None,
        "out": str(workdir / f"{name}.result.json"),
        "cfg": str(workdir / f"{name}.config.json"),
    }


class RankResult:
    def __init__(self, cfg: Mapping[str, Any], returncode: int, stderr: str) -> None:
        self.cfg = cfg
        self.returncode = returncode
        self.stderr = stderr
        try:
            self.data = json.loads(Path(cfg["out"]).read_text())
        except (OSError, ValueError):
            self.data = {"rows": [], "states": [], "error": None}

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    @property
    def error(self) -> dict[str, str] | None:
        return self.data.get("error")

    @property
    def states(self) -> list[dict[str, Any]]:
        return self.data.get("states", [])

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.data.get("rows", [])

    def __repr__(self) -> str:
        return f"<rank {self.cfg['rank']} rc={self.returncode} error={self.error} stderr={self.stderr[-600:]!r}>"


class Zygote:
    """Client of ``zygote.py``: forks rank processes from a pre-imported parent."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "zygote.py")], cwd=str(REPO), env=child_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError("the rank zygote did not start")

    def _ask(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        self.proc.stdin.write(json.dumps(cmd) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError("the rank zygote died")
        return json.loads(line)

    def spawn(self, cfg_path: str, stderr_path: str, env: Mapping[str, str]) -> int:
        return int(self._ask({"op": "spawn", "cfg": cfg_path, "stderr": stderr_path, "env": dict(env), "cwd": str(REPO)})["pid"])

    def wait(self, pid: int, timeout: float) -> int | None:
        return self._ask({"op": "wait", "pid": pid, "timeout": max(0.0, timeout)})["rc"]

    def close(self) -> None:
        try:
            self._ask({"op": "exit"})
        except (RuntimeError, OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


#: Set by the session fixture in conftest.py; rank processes are forked from it.
ZYGOTE: Zygote | None = None


def start_ranks(configs: Sequence[Mapping[str, Any]], env: Mapping[str, str] | None = None) -> list[int]:
    """Start one process per config; returns their pids."""
    assert ZYGOTE is not None, "the zygote fixture is not active"
    pids = []
    for cfg in configs:
        Path(cfg["cfg"]).write_text(json.dumps(cfg))
        pids.append(ZYGOTE.spawn(cfg["cfg"], cfg["out"] + ".stderr", child_env(env)))
    return pids


def wait_ranks(pids: Sequence[int], configs: Sequence[Mapping[str, Any]], timeout: float) -> list[RankResult]:
    assert ZYGOTE is not None
    deadline = time.monotonic() + timeout
    out = []
    for n, (pid, cfg) in enumerate(zip(pids, configs)):
        rc = ZYGOTE.wait(pid, deadline - time.monotonic())
        if rc is None:
            for other in pids[n:]:  # our own rank processes, by pid
                try:
                    os.kill(other, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                ZYGOTE.wait(other, 30)
            raise AssertionError(f"rank {cfg['rank']} of {cfg['run_id']} did not finish within {timeout:g}s")
        try:
            err = Path(cfg["out"] + ".stderr").read_text(errors="replace")
        except OSError:
            err = ""
        out.append(RankResult(cfg, rc, err))
    return out


def run_ranks(configs: Sequence[Mapping[str, Any]], timeout: float = 120.0, env: Mapping[str, str] | None = None) -> list[RankResult]:
    return wait_ranks(start_ranks(configs, env), configs, timeout)


def write_json(path: Path, value: Any) -> str:
    path.write_text(json.dumps(value))
    return str(path)


def checkpoint_in_thread(pipeline: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Start ``pipeline.checkpoint()`` in a thread; the dict gets its ``state`` or its ``error``."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["state"] = pipeline.checkpoint()
        except Exception as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def wait_for(predicate, timeout: float, what: str, interval: float = 0.01) -> None:
    """Poll ``predicate`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = interval
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


def shared_tmpdir(prefix: str = "zephon-rel-") -> Path:
    """A folder every user can reach (for the unprivileged-rank case)."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    d.chmod(0o755)
    return d


def merged_headers(agg: str, run_id: str) -> dict[int, dict[str, Any]]:
    """The headers of the merged states in a local ``<agg>/<run_id>/``, by round number (notes that send readers on left out)."""
    out = {}
    for p in (Path(agg) / run_id).glob("merged-*.json"):
        head = json.loads(p.read_bytes().split(b"\n", 1)[0])
        if head.get("kind") == "zephon.merged":
            out[head["round"]] = head
    return out


def part_token(agg: str, run_id: str, rank: int) -> str | None:
    """The round token in a local ``part-<rank>.json``, or None."""
    try:
        return json.loads((Path(agg) / run_id / f"part-{rank}.json").read_bytes().split(b"\n", 1)[0]).get("token")
    except (OSError, ValueError):
        return None


def round_token(agg: str, run_id: str, storage_options: Mapping[str, Any] | None = None) -> str | None:
    """The token in ``<agg>/<run_id>/round.json``, or None."""
    import fsspec

    fs, _, (root,) = fsspec.get_fs_token_paths(agg, storage_options=dict(storage_options or {}))
    fs.invalidate_cache()
    try:
        return json.loads(fs.cat_file(f"{root.rstrip('/')}/{run_id}/round.json")).get("token")
    except (FileNotFoundError, ValueError):
        return None
