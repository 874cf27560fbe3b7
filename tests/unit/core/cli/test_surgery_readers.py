"""``zephon trace``, ``report`` and ``verify-elastic`` on a run that had surgery (issue #35): given the run's state
(``--journal``; ``report`` reads a checkpoint's own journal, and audit logs' from ``--journal``) they show what
the run trained on: a skipped step marked as not trained with its data, a later step as the lanes delivered it,
quarantined documents absent; the report leaves the skipped steps out of its figures; verify-elastic runs the
journal on both topologies."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.cli import zephon

from zephon_core.checkpoint.state import skip_in_state
from zephon_core.integration.batch_log import log_line
from zephon_core.verify.simulate import Phase, run_phase

ROOT = Path(__file__).resolve().parents[4]
DEMO = str(ROOT / "configs" / "data" / "demo.toml")
B = 8  # batches a step: one a lane
LATE = 214  # a document lane 0 first reads at step 13, in its lane chunk 1 (quarantined from lane chunk 1 on)


def _make(G: int, g: int):
    from zephon_core.recipe import load_recipe

    return load_recipe(DEMO).build_standalone(dp_degree=G, dp_group_id=g, prefetch=0)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The demo run: 2 steps on 2 groups, then steps 3..4 skipped and documents 214 and 693 quarantined (by the
    CLI), resumed on 4 groups for 13 more steps (global steps 3..15, 11 of them trained); every rank's audit log."""
    out = tmp_path_factory.mktemp("surgery")
    (out / "logs").mkdir()
    delivered: dict[tuple[int, int], str] = {}

    def on_batch(phase: str):
        def log(g: int, b) -> None:
            delivered[(b.lane, b.lane_index)] = b.digest
            with (out / "logs" / f"{phase}-{g}.log").open("a") as f:
                f.write(log_line(b))
        return log

    _, state = run_phase(_make, Phase(2, 2), B, None, on_batch=on_batch("a"))
    (out / "state.json").write_text(json.dumps(skip_in_state(state, 3, 4, B)))
    r = zephon("quarantine", DEMO, "--state", str(out / "state.json"), "--document", f"stdlib_docs.jsonl#{LATE}",
               "--document", "stdlib_docs.jsonl#693")
    assert r.returncode == 0, r.stderr
    _, final = run_phase(_make, Phase(4, 11), B, json.loads((out / "state.json").read_text()), on_batch=on_batch("b"))
    (out / "final.json").write_text(json.dumps(final))
    return out, delivered


def _trace(step: int, *journal: str) -> tuple[str, list[str], dict[tuple[int, int], str]]:
    r = zephon("trace", DEMO, "--step", str(step), "--batches-per-step", str(B), *journal)
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith(("  lane ", "    row "))]
    digests = {(int(m[1]), int(m[2])): m[3] for m in re.finditer(r"lane (\d+) batch (\d+)  digest (\w+)", r.stdout)}
    return r.stdout, rows, digests


def test_trace_marks_a_skipped_step_and_shows_later_steps_as_the_lanes_delivered_them(run):
    out, delivered = run
    journal = ("--journal", str(out / "state.json"))
    text, rows, _ = _trace(3, *journal)
    assert "global step 3: SKIPPED by surgery (steps 3..4, journaled): its data did not train" in text
    assert rows == _trace(3)[1]  # the data left out: the step as the run without the skip has it
    assert not any(index == 2 for _, index in delivered)  # and no rank trained on it
    text, rows, digests = _trace(5, *journal)
    assert "global step 5: 8 batches" in text and rows == _trace(5)[1]  # after the skip: unchanged
    assert digests == {k: d for k, d in delivered.items() if k[1] == 4}  # what the ranks trained on at step 5


def test_trace_shows_a_quarantined_document_absent_as_the_run_delivered_the_step(run):
    out, delivered = run
    text, rows, digests = _trace(13, "--journal", str(out / "state.json"))
    assert f"quarantined (journaled): stdlib_docs.jsonl#{LATE} left out of this step" in text
    assert not any(f"#{LATE}[" in row for row in rows)
    assert any(f"#{LATE}[" in row for row in _trace(13)[1])  # without the quarantine the step holds it
    assert digests == {k: d for k, d in delivered.items() if k[1] == 12}


def test_report_notes_the_journal_and_leaves_the_skipped_steps_out_of_its_figures(run):
    out, _ = run
    from_state = zephon("report", str(out / "final.json"), "--recipe", DEMO, "--batches-per-step", str(B))
    from_logs = zephon("report", str(out / "logs"), "--recipe", DEMO, "--batches-per-step", str(B),
                       "--journal", str(out / "final.json"))
    assert from_state.returncode == 0 and from_logs.returncode == 0, from_state.stderr + from_logs.stderr
    total = [line for line in from_state.stdout.splitlines() if line.startswith("total: ")]
    assert total and total == [line.split(";")[0] for line in from_logs.stdout.splitlines()
                               if line.startswith("total: ")]  # the logs hold only what trained
    assert from_state.stdout.startswith(f"checkpoint {out / 'final.json'}: {13 * B} batches, at step 15")
    notes = [line for line in from_state.stdout.splitlines() if line.startswith("note: surgery: ")]
    assert notes == [line for line in from_logs.stdout.splitlines() if line.startswith("note: surgery: ")]
    assert notes == ["note: surgery: steps 3..4 skipped (journaled): their data did not train, left out of these "
                     "figures", f"note: surgery: quarantined stdlib_docs.jsonl#{LATE}, stdlib_docs.jsonl#693 from lane "
                     "chunks [1, 1, 1, 1, 1, 1, 1, 1] on (journaled)"]


def test_verify_elastic_runs_the_journal_on_both_topologies(run):
    out, _ = run
    r = zephon("verify-elastic", DEMO, "--canonical-replicas", "8", "--from", "2", "--to", "4", "--checkpoint-step",
               "5", "--steps", "13", "--batches-per-step", str(B), "--journal", str(out / "state.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"surgery journal of {out / 'state.json'}, applied on both topologies: skips: steps 3..4" in r.stdout
    assert "ok: 13 trained steps (global steps 1..15 less the skipped) identical" in r.stdout
