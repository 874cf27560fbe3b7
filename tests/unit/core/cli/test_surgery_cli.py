"""``zephon skip`` run as a user would (issue #35): the state is rewritten whole with the skip journaled, the resume
leaves the steps out, and every command of docs/when_a_run_goes_wrong.md runs as written on a real run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import zephon
from support.doc_commands import documented

from zephon_core.checkpoint.surgery import surgery_journal_of
from zephon_core.integration.batch_log import log_identity, log_line, parse_line
from zephon_core.verify.simulate import Phase, first_mismatch, run_phase

ROOT = Path(__file__).resolve().parents[4]
DEMO = ROOT / "configs" / "data" / "demo.toml"
PAGE = "docs/when_a_run_goes_wrong.md"


def _make(G: int, g: int):
    from zephon_core.recipe import load_recipe

    return load_recipe(DEMO).build_standalone(dp_degree=G, dp_group_id=g, prefetch=0)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A folder holding run/state.json, the demo recipe after 2 global steps of 8 batches on 2 groups, and the
    groups' batch audit logs run/batches-{rank}.log (lines of the present format: with the run's identity)."""
    out = tmp_path_factory.mktemp("run")
    (out / "run").mkdir()
    logs = {g: (out / "run" / f"batches-{g}.log").open("w") for g in (0, 1)}
    identity = log_identity(_make(1, 0).definition())
    _, state = run_phase(_make, Phase(2, 2), 8, None, on_batch=lambda g, b: logs[g].write(log_line(b, identity)))
    for f in logs.values():
        f.close()
    (out / "run" / "state.json").write_text(json.dumps(state))
    losses = [(2, 693, 7.5, 100), (2, 12, 2.0, 50), (2, 693, 1.5, 100), (1, 12, 9.0, 10), (2, 40, 3.0, 20)]
    (out / "run" / "losses-0.jsonl").write_text("".join(
        json.dumps({"step": st, "source": "stdlib_docs.jsonl", "document": d, "loss": loss, "tokens": n}) + "\n"
        for st, d, loss, n in losses))
    return out


def test_skip_journals_the_steps_and_the_resume_leaves_them_out(run_folder, tmp_path):
    state_path = run_folder / "run" / "state.json"
    out = tmp_path / "skipped.json"
    r = zephon("skip", "--state", str(state_path), "--steps", "4..5", "--batches-per-step", "8", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "steps 4..5" in r.stdout
    skipped = json.loads(out.read_text())
    assert [str(s) for s in surgery_journal_of(skipped).skips] == ["steps 4..5"]
    before = json.loads(state_path.read_text())
    assert skipped["lanes"] == before["lanes"]  # only the journal changed
    reference, _ = run_phase(_make, Phase(1, 8), 8, None)
    resumed, _ = run_phase(_make, Phase(4, 4), 8, skipped)
    assert first_mismatch(resumed, reference[2:3] + reference[5:8]) is None


def test_a_bad_skip_is_one_line_and_leaves_the_state_as_it_was(run_folder, tmp_path):
    path = tmp_path / "state.json"
    path.write_bytes((run_folder / "run" / "state.json").read_bytes())
    original = path.read_bytes()
    for steps, says in (("1..3", "past step 0"), ("3..x", "--steps '3..x'"), ("5..4", "1 <= A <= B")):
        r = zephon("skip", "--state", str(path), "--steps", steps, "--batches-per-step", "8")
        assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert path.read_bytes() == original


PAGE_COMMANDS = [c for c in documented() if c.where.startswith(PAGE) and "run/" in c.text]  # the rest are synopses


def test_the_documented_commands_run_as_written(run_folder, tmp_path):
    assert PAGE_COMMANDS
    (tmp_path / "run").mkdir()
    for f in (run_folder / "run").iterdir():
        (tmp_path / "run" / f.name).write_bytes(f.read_bytes())
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    outputs = []
    for c in PAGE_COMMANDS:
        r = subprocess.run(["bash", "-c", c.text], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{c.where}: `{c.text}` failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        outputs.append(r.stdout)
    assert "stdlib_docs.jsonl#693 (" in "".join(outputs) and "every batch agrees" in outputs[-2]
    assert "a1836a026bfdfe68: stdlib_docs.jsonl#155\n" in "".join(outputs)  # the quarantine's hash, resolved
    assert "surgery journal of run/state.json, applied on both topologies" in "".join(outputs)  # verify-elastic
    ledgers = [out for c, out in zip(PAGE_COMMANDS, outputs) if c.text.startswith("zephon ledger")]
    assert all("built from the batch audit logs (2 files; no replay)" in out for out in ledgers[:-1])
    assert "built by replay" in ledgers[-1] and "--replay" in PAGE_COMMANDS[outputs.index(ledgers[-1])].text
    assert ledgers[0].count("stdlib_docs.jsonl#") >= 16  # step 2: 8 batches of 2 rows, a stretch or more a row
    ranked = [line.split()[-1] for line in outputs[-1].splitlines()[1:]]  # zephon blame: token-weighted means
    assert ranked == ["stdlib_docs.jsonl#693", "stdlib_docs.jsonl#40", "stdlib_docs.jsonl#12"]
    assert (tmp_path / "run" / "ledger.parquet").stat().st_size > 0


def test_the_ledger_from_logs_refuses_a_missing_or_altered_line_naming_it(run_folder, tmp_path):
    """The logs are the ledger's only input then: a batch the state holds that no log has, or one logged twice
    with two digests, is refused in one line; ``--replay`` compares the logs with the recipe's batches."""
    lines = (run_folder / "run" / "batches-1.log").read_text().splitlines(keepends=True)
    lane, index = lines[3].split()[:2]
    (tmp_path / "batches-0.log").write_bytes((run_folder / "run" / "batches-0.log").read_bytes())
    args = ("ledger", str(DEMO), "--state", str(run_folder / "run" / "state.json"), "--batches-per-step", "8",
            "--logs", str(tmp_path / "batches-*.log"))
    (tmp_path / "batches-1.log").write_text("".join(lines[:3] + lines[4:]))
    r = zephon(*args)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"lane {lane} batch {index} (step {int(index) + 1}) is in no log" in r.stderr  # a lane's batch a step
    peer = parse_line(lines[3])._replace(digest="0" * 32)  # a peer of the same launch logged it with another digest
    (tmp_path / "batches-9.log").write_text(log_line(peer))
    (tmp_path / "batches-1.log").write_text("".join(lines))
    r = zephon(*args)
    assert r.returncode == 1 and f"lane {lane} batch {index}: its digest in {tmp_path}/batches-1.log line 4 and in " \
        f"{tmp_path}/batches-9.log line 1 differ" in r.stderr, r.stderr
    (tmp_path / "batches-9.log").unlink()
    moved = parse_line(lines[3])
    moved = moved._replace(rows=moved.rows.replace(".", ".1", 1))  # its first stretch names another document
    (tmp_path / "batches-1.log").write_text("".join(lines[:3] + [log_line(moved)] + lines[4:]))
    r = zephon(*args, "--replay")
    assert r.returncode == 1 and f"LOG: lane {lane} batch {index} ({tmp_path}/batches-1.log line 4): the log's rows " \
        "are not the ledger's" in r.stdout, r.stdout + r.stderr


def test_blame_refuses_a_line_that_is_not_a_loss_line(tmp_path):
    good = '{"step": 1, "source": "m", "document": 3, "loss": 1.0, "tokens": 5}'
    (tmp_path / "l.jsonl").write_text(good + '\n{"step": 1}\n')
    r = zephon("blame", "--step", "1", "--losses", str(tmp_path / "l.jsonl"))
    assert r.returncode == 1 and "l.jsonl line 2: not a loss line" in r.stderr
