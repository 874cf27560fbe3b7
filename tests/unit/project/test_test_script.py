"""scripts/test.sh: a pytest selection runs only that, and Ctrl-C / SIGTERM stop everything it started.

Each case runs the real script on tests of script_target.py, with its own artifacts folder
(ZEPHON_ARTIFACTS) so the suite's own run is untouched, and sends real signals.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TARGET = "tests/unit/project/script_target.py"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "ZEPHON_ARTIFACTS": str(tmp_path / "artifacts"), **extra}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has exited: it only waits for its parent to reap it
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_selection_runs_only_that_and_ends_with_the_summary_line(tmp_path):
    r = subprocess.run(["bash", "scripts/test.sh", f"{TARGET}::test_quick"], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "== lint" not in r.stdout and "== MPI matrix" not in r.stdout and "== serial suite" not in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "zephon: 1 passed, 0 failed, 0 skipped"


def test_fast_runs_lint_and_the_serial_suite_without_e2e_topology_tests_or_the_mpi_matrix(tmp_path):
    # Pytest options after --fast reach pytest: --collect-only shows what the inner loop runs, in seconds.
    r = subprocess.run(["bash", "scripts/test.sh", "--fast", "--collect-only"], cwd=ROOT, env=_env(tmp_path),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "== lint" in r.stdout and "== serial suite without e2e or topology tests" in r.stdout
    assert "== MPI matrix" not in r.stdout
    ids = [line.strip() for line in r.stdout.splitlines() if line.startswith("tests/")]
    collected = [i.split("::")[0] for i in ids]
    assert {"tests/unit/core/checkpoint/test_restore.py", "tests/reliability/test_faults_restore.py"} <= set(collected)
    launches = [f for f in collected if f.startswith("tests/e2e/")]
    assert not launches, f"the e2e tests (torchrun launches) are not deselected: {launches}"
    # The whole-topology property tests (marked topology) are left to the full run.
    assert "tests/unit/core/pipeline/test_properties.py::test_checkpoint_at_any_batch_restores_byte_identically" in ids
    whole = ("::test_elastic_equivalence_per_step", "::test_random_topologies_checkpoints_and_crashes")
    topology = [i for i in ids if i.endswith(whole)]
    assert not topology, f"the whole-topology property tests are not deselected: {topology}"


def test_an_empty_selection_is_not_a_failure(tmp_path):
    r = subprocess.run(["bash", "scripts/test.sh", TARGET, "-k", "quick and not quick"], cwd=ROOT, env=_env(tmp_path),
                       capture_output=True, text=True, timeout=600)
    # Nothing selected: pytest's exit 5 is not a failure, and the count says so.
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "zephon: 0 passed, 0 failed, 0 skipped", r.stdout[-2000:]


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_a_signal_stops_every_process_it_started(tmp_path, how):
    pidfile = tmp_path / "pids"
    proc = subprocess.Popen(["bash", "scripts/test.sh", f"{TARGET}::test_sleeps_with_children"], cwd=ROOT,
                            env=_env(tmp_path, ZEPHON_SIGNAL_TARGET=str(pidfile)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not pidfile.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the target test never started"
            time.sleep(0.2)
        pids = [int(p) for p in pidfile.read_text().split()]
        assert all(_alive(p) for p in pids)
        if how == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:  # what a terminal sends: SIGINT to the whole foreground process group
            os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == (143 if how == "SIGTERM" else 130), out[-2000:]
        assert "zephon: interrupted" in out
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)], f"left running: {[p for p in pids if _alive(p)]} (pytest, own-session child, timeout child)"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in [int(x) for x in pidfile.read_text().split()] if pidfile.exists() else []:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
