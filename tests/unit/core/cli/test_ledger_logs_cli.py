"""``zephon ledger --logs`` on logs it must not trust (issue #40): another run's logs, a torn or binary file are
refused in one line naming the file and line; a build from the logs alone says what it checked, never
``every batch agrees``; ``--step`` past the run is one line, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import zephon

from zephon_core.integration.batch_log import LogIdentity, log_identity, log_line
from zephon_core.verify.simulate import Phase, run_phase

ROOT = Path(__file__).resolve().parents[4]
DEMO = ROOT / "configs" / "data" / "demo.toml"


def _make(G: int, g: int):
    from zephon_core.recipe import load_recipe

    return load_recipe(DEMO).build_standalone(dp_degree=G, dp_group_id=g, prefetch=0)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The demo recipe after 2 global steps of 8 batches on 2 groups: state.json and its logs batches-{g}.log, each
    line of one (here: made up) launch; and another run's logs (same shape, other run) in other/."""
    out = tmp_path_factory.mktemp("run")
    (out / "other").mkdir()
    ours = log_identity(_make(1, 0).definition())
    theirs = LogIdentity("0123456789abcdef", ours.launch)
    logs = {g: (out / f"batches-{g}.log").open("w") for g in (0, 1)}
    other = {g: (out / "other" / f"batches-{g}.log").open("w") for g in (0, 1)}

    def write(g, b):
        logs[g].write(log_line(b, ours))
        other[g].write(log_line(b, theirs))
    _, state = run_phase(_make, Phase(2, 2), 8, None, on_batch=write)
    for f in [*logs.values(), *other.values()]:
        f.close()
    (out / "state.json").write_text(json.dumps(state))
    return out


def _ledger(run: Path, *more: str, logs: str | None = None):
    return zephon("ledger", str(DEMO), "--state", str(run / "state.json"), "--batches-per-step", "8",
                  "--logs", logs or str(run / "batches-*.log"), *more)


def _refused(r, says: str) -> None:
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stderr


def test_a_build_from_the_logs_says_what_it_checked_not_that_every_batch_agrees(run):
    r = _ledger(run)
    assert r.returncode == 0, r.stderr
    assert "every batch agrees" not in r.stdout
    assert "batch logs (2 files): the ledger built from them; 16 lines' run identities and checksums verified" \
        in r.stdout, r.stdout


def test_a_step_past_the_run_is_one_line(run):
    _refused(_ledger(run, "--step", "3"), "--step 3: the ledger of ")
    _refused(_ledger(run, "--step", "0"), "has steps 1..2")


def test_another_runs_logs_are_refused_naming_the_file_and_line(run):
    _refused(_ledger(run, logs=str(run / "other" / "batches-*.log")),
             f"{run}/other/batches-0.log line 1: a line of run 0123456789abcdef, not of the state's run")


def test_a_torn_or_binary_log_is_refused_naming_the_file(run, tmp_path):
    lines = (run / "batches-1.log").read_text().splitlines(keepends=True)
    (tmp_path / "batches-0.log").write_bytes((run / "batches-0.log").read_bytes())
    (tmp_path / "batches-1.log").write_text("".join(lines[:-1]) + lines[-1][:lines[-1].rindex("/")])
    _refused(_ledger(run, logs=str(tmp_path / "batches-*.log")),
             f"{tmp_path}/batches-1.log line {len(lines)}: the last line is cut short")
    (tmp_path / "batches-1.log").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    _refused(_ledger(run, logs=str(tmp_path / "batches-*.log")), f"{tmp_path}/batches-1.log line 1: not UTF-8 text")
