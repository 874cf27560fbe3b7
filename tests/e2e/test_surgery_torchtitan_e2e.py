"""Skipping steps after a loss spike under TorchTitan 0.3, proven by launches (issue #35).

An uninterrupted run of 10 steps at dp=2 (checkpoints every 2); a spike at step 5 (simulated: the test picks it);
the rollback: resume from step 4 with the recipe's ``[surgery] skip_steps = ["5..6"]`` through step 8; then that
run resumed from its step 6 (a checkpoint taken at a skipped step) at dp=1 through step 10, the table still in the
recipe. The batch audit logs (``ZEPHON_BATCH_LOG``) say what each global step held; ``zephon ledger`` must agree.
The rollback launch and the ledger are docs/when_a_run_goes_wrong.md's commands, with this run's paths and steps.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.doc_commands import ROOT, after, find
from torchtitan_cpu.runs import GLOBAL_BATCH, LOCAL_BATCH, launch, steps_of, surgery_recipe

from zephon_core.checkpoint.surgery import Skip, surgery_journal_of
from zephon_core.integration.state_readers import load_state

pytestmark = pytest.mark.e2e
C = 4  # configs/data/tt_train.toml
BATCHES_PER_STEP = GLOBAL_BATCH // LOCAL_BATCH
SPIKE, LAST = 5, 6  # the spike, and the last step skipped after it
STEPS = 10
JOURNALED = f"surgery: steps {SPIKE}..{LAST} skipped ({BATCHES_PER_STEP} batches a step), journaled in the loader state"
SKIPPED = f"zephon: steps {SPIKE}..{LAST} skipped by the surgery journal: no forward/backward"
ROLLBACK = find(r"--checkpoint\.load_step")  # the documented resume with the recipe's [surgery] table
LEDGER = find(r"^zephon ledger .* --framework torchtitan")


def with_values(argv: list[str], values: dict[str, str | list[str]]) -> list[str]:
    """``argv`` with the value after each flag in ``values`` replaced (a list: by several)."""
    out = list(argv)
    for flag, value in values.items():
        i = out.index(flag) + 1
        out[i:i + 1] = value if isinstance(value, list) else [value]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("surgery")
    plain, skipping = surgery_recipe(root, None), surgery_recipe(root, f"{SPIKE}..{LAST}")
    ref = launch("0.3", 2, root / "ref", steps=STEPS, zephon_trainer=True, loader={"recipe": str(plain)})
    documented = after(ROLLBACK.argv(), "-m torchtitan.train")
    assert documented[:4] == ["--module", "zephon_torchtitan", "--config", "llama3_debugmodel_zephon"]  # zephon_trainer
    rollback = with_values(documented[4:], {"--dataloader.recipe": str(skipping),
                                            "--checkpoint.load_step": str(SPIKE - 1)})
    skip = launch("0.3", 2, root / "skip", steps=8, zephon_trainer=True, loader={"recipe": str(skipping)},
                  resume_from=root / "ref" / "checkpoint" / f"step-{SPIKE - 1}", extra=rollback)
    dp1 = launch("0.3", 1, root / "dp1", steps=STEPS, zephon_trainer=True, loader={"recipe": str(skipping)},
                 resume_from=root / "skip" / "checkpoint" / f"step-{LAST}")
    return root, skipping, {"ref": ref, "skip": skip, "dp1": dp1}


def test_the_skipped_steps_train_nothing_and_the_next_ones_hold_what_they_held(runs):
    root, _, r = runs
    ref, skip = steps_of(root / "ref", C), steps_of(root / "skip", C)
    assert sorted(ref) == list(range(1, STEPS + 1)) and sorted(r["ref"].losses) == sorted(ref)
    # Resumed at step 5; steps 5 and 6 ran no training (no loss line, no batch), steps 7 and 8 did.
    assert r["skip"].start_step == SPIKE and sorted(r["skip"].losses) == [7, 8], r["skip"].log_text()[-3000:]
    assert sorted(skip) == [7, 8]
    for step in (7, 8):
        assert len(skip[step]) == C and skip[step] == ref[step], f"step {step} after the skip is not the run's"
    text = r["skip"].log_text()
    assert text.count(JOURNALED) == 1 and text.count(SKIPPED) == 1, text[-3000:]
    # Checkpointed as TorchTitan checkpoints any step, skipped or not.
    assert (root / "skip" / "checkpoint" / f"step-{LAST}").is_dir()


def test_a_resume_on_another_degree_keeps_the_skip_and_journals_nothing_again(runs):
    root, _, r = runs
    ref, dp1 = steps_of(root / "ref", C), steps_of(root / "dp1", C)
    assert r["dp1"].start_step == LAST + 1 and sorted(r["dp1"].losses) == [7, 8, 9, 10]
    assert sorted(dp1) == [7, 8, 9, 10] and all(dp1[s] == ref[s] for s in dp1)
    text = r["dp1"].log_text()
    assert "from dp=2 to dp=1" in text and JOURNALED not in text and "skipped by the surgery journal" not in text
    for run, step in (("skip", 8), ("dp1", STEPS)):
        journal = surgery_journal_of(load_state(str(root / run / "checkpoint" / f"step-{step}")))
        assert journal.skips == (Skip(SPIKE, LAST, BATCHES_PER_STEP // C),) and not journal.quarantines


def test_the_ledger_agrees_with_the_audit_logs_on_every_step(runs):
    import pyarrow.parquet as pq

    root, recipe, _ = runs
    ledger = root / "ledger.parquet"
    # What the last run's model trained on: the first run's steps 1-4, the last run's 7-10 (its logs hold them).
    argv = LEDGER.argv()
    argv[2] = str(recipe)
    cmd = with_values(argv, {"--state": str(root / "dp1" / "checkpoint" / f"step-{STEPS}"),
                             "--logs": [str(root / "ref" / "batches-*.log"), str(root / "dp1" / "batches-*.log")]})
    assert cmd[cmd.index("--batches-per-step") + 1] == str(BATCHES_PER_STEP)  # the documented shape is this run's
    cmd = [str(Path(sys.executable).parent / "zephon"), *cmd[1:], "--parquet", str(ledger)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0 and "identities and checksums verified" in out.stdout, \
        out.stdout[-3000:] + out.stderr[-3000:]
    table = pq.read_table(ledger, columns=["step", "lane", "lane_index"]).to_pylist()
    in_ledger: dict[int, set[tuple[int, int]]] = {}
    for row in table:
        in_ledger.setdefault(row["step"], set()).add((row["lane"], row["lane_index"]))
    ref, dp1 = steps_of(root / "ref", C), steps_of(root / "dp1", C)
    logged = {s: set(ref[s]) for s in range(1, SPIKE)} | {s: set(dp1[s]) for s in dp1}
    assert in_ledger == logged, f"ledger steps {sorted(in_ledger)}, logged {sorted(logged)}"
