"""A mixture TorchTitan's run steers by ODM on its own per-source losses, resumed on another degree with surgery
(issue #40, launches with real losses).

Two launches of TorchTitan 0.3 on CPU (``ZephonTrainer``) over two token-array sources mixed 1:1, the recipe's
``[mixing]`` ODM asked every 2 logged steps (``support.odm_runs``: asks at 2 (uniform: nothing journaled), 4, 6,
8 and 10; the losses logged every step):

* ``steered``: dp=2, 5 steps, checkpointed at step 5: after the decision of step 4, half-way to the next, so the
  steering clock holds the controller asked at 4 and step 5's losses;
* ``resumed``: dp=1 from that checkpoint to step 10, the recipe with ``[surgery]`` skipping step 9 and
  quarantining a document step 6 would train on.

Checked: every decision after the resume is the one ODM makes offline from the checkpoint's clock over the
journaled figures (``check_odm_resume``); every trained step's batches (the audit logs) are the recipe's with the
final state's journal replayed and its surgery applied, step 9 absent, the quarantined document absent from the
resume on; ``zephon ledger`` from the logs is the ledger by replay.
"""

from __future__ import annotations

import re

import pytest
from support.ledger_runs import ledger_both_ways
from support.odm_runs import check_odm_resume, document_to_quarantine, odm_recipe, replayed, steps_holding

from zephon_core.checkpoint.steering import clock_of
from zephon_core.checkpoint.surgery import Skip, SurgeryJournal, surgery_journal_of
from zephon_core.curriculum.definition import parse_definition

pytestmark = pytest.mark.e2e
C, SAVED, STEPS, SKIPPED = 4, 5, 10, 9


def make(recipe):
    """The recipe's pipeline as TorchTitan's launches build it, on one data-parallel group."""
    from torchtitan_cpu.runs import GLOBAL_BATCH, LOCAL_BATCH, SEQ_LEN

    from zephon_core.recipe import load_recipe

    return lambda: load_recipe(recipe).build(seq_len=SEQ_LEN, batch_size=LOCAL_BATCH, global_batch_size=GLOBAL_BATCH,
                                             canonical_replicas=C, dp_degree=1, dp_group_id=0, prefetch=0)


def step_of(lane_index: int) -> int:
    from torchtitan_cpu.runs import GLOBAL_BATCH, LOCAL_BATCH

    return lane_index // (GLOBAL_BATCH // LOCAL_BATCH // C) + 1


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from torchtitan_cpu.runs import GLOBAL_BATCH, LOCAL_BATCH, launch, token_corpora

    from zephon_torchtitan.state import read_dcp_state

    root = tmp_path_factory.mktemp("tt-odm")
    token_corpora(root)
    head = f"global_batch_size = {GLOBAL_BATCH}\n"
    plain = odm_recipe(root, "odm", lanes=C, head=head)
    opts = dict(metrics=True, source_loss=True, mixing=True, zephon_trainer=True,
                extra=["--checkpoint.interval", str(SAVED)])
    a = launch("0.3", 2, root / "steered", steps=SAVED, loader={"recipe": str(plain)}, **opts)
    saved = read_dcp_state(str(root / "steered" / "checkpoint" / f"step-{SAVED}"))
    document = document_to_quarantine(make(plain), saved, GLOBAL_BATCH // LOCAL_BATCH)
    surgery = f'skip_steps = ["{SKIPPED}..{SKIPPED}"]\nquarantine = ["{document[0]}#{document[1]}"]\n'
    recipe = odm_recipe(root, "odm_surgery", lanes=C, head=head, surgery=surgery)
    b = launch("0.3", 1, root / "resumed", steps=STEPS, loader={"recipe": str(recipe)},
               resume_from=root / "steered" / "checkpoint" / f"step-{SAVED}", **opts)
    final = read_dcp_state(str(root / "resumed" / "checkpoint" / f"step-{STEPS}"))
    return root, recipe, document, (a, saved), (b, final)


def test_every_decision_after_the_resume_is_odms_own_from_the_steering_clock(runs):
    from torchtitan_cpu.runs import GLOBAL_BATCH, SEQ_LEN

    from zephon_core.recipe import load_recipe

    root, recipe, _, (a, saved), (b, final) = runs
    assert sorted(a.losses) == list(range(1, SAVED + 1))
    assert b.start_step == SAVED + 1 and b.loaded_checkpoint and f"step-{SAVED}" in b.loaded_checkpoint
    assert sorted(b.losses) == [s for s in range(SAVED + 1, STEPS + 1) if s != SKIPPED], b.log_text()[-3000:]
    clock = clock_of(saved)
    assert clock is not None and clock.asked_at == 4, "the clock: asked after step 4, step 5's losses summed"
    assert sum(clock.loss_tokens) == GLOBAL_BATCH * SEQ_LEN
    before, after = (parse_definition(s["definition"]).journal for s in (saved, final))
    assert [d.step for d in before.decisions] == [4], "asked at 2 (uniform: kept) and 4"

    def trained(after_step: int, upto: int) -> int:
        return sum(1 for s in range(after_step + 1, upto + 1) if s != SKIPPED)

    made = check_odm_resume(load_recipe(recipe).mixing(), clock, before, after, trained, GLOBAL_BATCH * SEQ_LEN)
    assert made == [6, 8, 10]
    said = re.findall(r"zephon: mixing decision (\d+) after step (\d+)", b.log_text())
    assert said == [("2", "6"), ("3", "8"), ("4", "10")], said
    assert re.findall(r"zephon: mixing decision (\d+) after step (\d+)", a.log_text()) == [("1", "4")]


def test_every_trained_step_holds_the_replay_of_the_journal_with_the_surgery(runs):
    from torchtitan_cpu.runs import steps_of

    root, _, document, _, (_, final) = runs
    journal = surgery_journal_of(final)
    assert journal.skips == (Skip(SKIPPED, SKIPPED, 1),)
    assert [q.documents for q in journal.quarantines] == [(document,)]
    batches = (STEPS - 1) * C
    want = replayed(make(root / "odm.toml"), final, batches, step_of)
    steered, resumed = steps_of(root / "steered", C), steps_of(root / "resumed", C)
    assert sorted(steered) == list(range(1, SAVED + 1))
    assert sorted(resumed) == [s for s in range(SAVED + 1, STEPS + 1) if s != SKIPPED]
    assert sorted(want.digests) == sorted({**steered, **resumed})
    assert {**steered, **resumed} == want.digests
    # The quarantine left the document out from the resume on; without it the resumed run would have trained on it.
    index = ("examples", "prose").index(document[0]), document[1]
    assert not [s for s in want.documents if s > SAVED and index in want.documents[s]]
    unquarantined = replayed(make(root / "odm.toml"), final, batches, step_of, SurgeryJournal(journal.skips))
    assert [s for s in unquarantined.documents if s > SAVED and index in unquarantined.documents[s]]
    assert {s: d for s, d in unquarantined.digests.items() if s <= SAVED} == steered


def test_the_ledger_from_the_logs_is_the_ledger_by_replay(runs, tmp_path):
    from torchtitan_cpu.runs import GLOBAL_BATCH, LOCAL_BATCH, SEQ_LEN

    root, recipe, document, _, _ = runs
    shape = ["--framework", "torchtitan", "--seq-len", str(SEQ_LEN), "--batch-size", str(LOCAL_BATCH),
             "--batches-per-step", str(GLOBAL_BATCH // LOCAL_BATCH)]
    state = root / "resumed" / "checkpoint" / f"step-{STEPS}"
    logs = [f"{root / d}/batches-rank*.log" for d in ("steered", "resumed")]
    _, table = ledger_both_ways(recipe, state, shape, logs, tmp_path)
    assert sorted(set(table.column("step").to_pylist())) == [s for s in range(1, STEPS + 1) if s != SKIPPED]
    assert all(s <= SAVED for s in steps_holding(table, document)), "quarantined from the resume on"
