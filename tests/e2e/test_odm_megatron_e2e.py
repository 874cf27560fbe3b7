"""A mixture Megatron's run steers by ODM on its own per-source losses, under pipeline parallelism, resumed on
another data-parallel degree with surgery (issue #40, launches with real losses).

Two launches of Megatron's wheel entry on CPU with ``--zephon-source-loss --zephon-mixing`` over two token-array
sources mixed 1:1, the recipe's ``[mixing]`` ODM asked every 2 logged iterations (``support.odm_runs``: asks at 2
(uniform: nothing journaled), 4, 6, 8 and 10):

* ``steered``: PP=2 x DP=2, stopped and saved at iteration 5 (``--exit-interval``): after the decision of
  iteration 4, half-way to the next, so the steering clock holds the controller asked at 4 and iteration 5's
  losses. Every rank loads (the first stage reads tokens, the last labels) and the last stage decides on the
  figures it broadcasts, on its own;
* ``resumed``: PP=2 x DP=1 from iteration 5 to 10, the recipe with ``[surgery]`` skipping iteration 9 and
  quarantining a document the resumed run would train on.

Checked: every decision after the resume is the one ODM makes offline from the checkpoint's clock over the
journaled figures; every loading rank of both stages trained, micro-batch for micro-batch, on the recipe with the
final state's journal replayed and its surgery applied (so the last stage decided as the first did), iteration 9
absent, the quarantined document absent from the resume on; ``zephon ledger`` from the logs is the ledger by replay.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.ledger_runs import ledger_both_ways
from support.odm_runs import check_odm_resume, document_to_quarantine, odm_recipe, replayed, steps_holding

from zephon_core.checkpoint.steering import clock_of
from zephon_core.checkpoint.surgery import Skip, SurgeryJournal, surgery_journal_of
from zephon_core.curriculum.definition import parse_definition

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not __import__("importlib").util.find_spec("megatron"),
                                                  reason="megatron-core is not installed")]
SAVED, STEPS, SKIPPED = 5, 10, 9
FLAGS = ["--zephon-source-loss", "--zephon-mixing"]


def state_at(run_dir, iteration):
    from zephon_megatron.state import find_state_file, read_loader_file

    path = find_state_file(str(run_dir / "loader"), iteration, 0, pipeline_parallel=True)
    assert path is not None, f"no loader state of iteration {iteration} in {run_dir}"
    return path, read_loader_file(path).state


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from harnesses import load
    from torchtitan_cpu.runs import token_corpora

    from zephon_core.recipe import load_recipe

    h = load("megatron")
    root = tmp_path_factory.mktemp("mg-odm")
    token_corpora(root)
    plain = odm_recipe(root, "odm", lanes=h.C)

    def make(recipe):
        return lambda: load_recipe(recipe).build(seq_len=h.SEQ, batch_size=h.MBS, global_batch_size=h.GBS,
                                                 dp_degree=1, dp_group_id=0, canonical_replicas=h.C, prefetch=0)

    # Sized for the whole run (Megatron's LR schedule must match on resume), stopped and saved at iteration 5.
    a = h.run(root, "steered", h.Zrun("wheel", 4, plain, pp=2, train_iters=STEPS, save_interval=SAVED,
                                      extra=[*FLAGS, "--exit-interval", str(SAVED)]))
    assert a.ok, a.log_tail()
    _, saved = state_at(a.run_dir, SAVED)
    document = document_to_quarantine(make(plain), saved, h.GBS // h.MBS)
    surgery = f'skip_steps = ["{SKIPPED}..{SKIPPED}"]\nquarantine = ["{document[0]}#{document[1]}"]\n'
    recipe = odm_recipe(root, "odm_surgery", lanes=h.C, surgery=surgery)
    b = h.run(root, "resumed", h.Zrun("wheel", 2, recipe, pp=2, train_iters=STEPS, save_interval=SAVED, extra=FLAGS,
                                      load=a.run_dir / "ckpt", load_step=SAVED,
                                      loader_states_from=a.run_dir / "loader"))
    assert b.ok, b.log_tail()
    return h, make(plain), recipe, document, (a, saved), (b, state_at(b.run_dir, STEPS)[1])


def test_every_decision_after_the_resume_is_odms_own_from_the_steering_clock(runs):
    h, _, recipe, _, (a, saved), (b, final) = runs
    from zephon_core.recipe import load_recipe

    assert "zephon: loader state restored at step 5 (20 batches delivered over 4 lanes) from dp=2 to dp=1" in b.text
    assert sorted(b.logged_losses) == [s for s in range(SAVED + 1, STEPS + 1) if s != SKIPPED]
    clock = clock_of(saved)
    assert clock is not None and clock.asked_at == 4 and sum(clock.loss_tokens) == h.GBS * h.SEQ
    before, after = (parse_definition(s["definition"]).journal for s in (saved, final))
    assert [d.step for d in before.decisions] == [4], "asked at 2 (uniform: kept) and 4"

    def trained(after_step: int, upto: int) -> int:
        return sum(1 for s in range(after_step + 1, upto + 1) if s != SKIPPED)

    made = check_odm_resume(load_recipe(recipe).mixing(), clock, before, after, trained, h.GBS * h.SEQ)
    assert made == [6, 8, 10]
    said = r"zephon: mixing decision (\d+) after iteration (\d+)"
    assert re.findall(said, a.text) == [("1", "4")]
    assert re.findall(said, b.text) == [("2", "6"), ("3", "8"), ("4", "10")]


def test_every_loading_rank_of_both_stages_trains_on_the_replay_with_the_surgery(runs):
    h, make, _, document, (a, _), (b, final) = runs
    journal = surgery_journal_of(final)
    assert journal.skips == (Skip(SKIPPED, SKIPPED, 1),) and [q.documents for q in journal.quarantines] == [(document,)]
    step_of = h.lane_index_to_step([h.GBS // h.MBS], h.C)
    want = replayed(make, final, (STEPS - 1) * h.C, step_of)
    trained = [s for s in range(1, STEPS + 1) if s != SKIPPED]
    lanes = {0: {0, 1}, 1: {2, 3}}  # PP=2 x DP=2: ranks 0, 1 the first stage, 2, 3 the last, dp rank = rank % 2
    for run, ranks, steps in ((a, 4, range(1, SAVED + 1)), (b, 2, trained[SAVED:])):
        logs = run.batch_log()
        assert sorted(logs) == list(range(ranks)), "every rank loads: tokens on the first stage, labels on the last"
        for rank, rows in logs.items():
            mine = {lane for lane in range(h.C) if ranks == 2 or lane in lanes[rank % 2]}
            assert {(lane, idx): d for lane, idx, d in rows} == {
                k: v for s in steps for k, v in want.digests[s].items() if k[0] in mine}, (run.run_dir.name, rank)
    assert sorted(want.digests) == trained
    index = ("examples", "prose").index(document[0]), document[1]
    assert not [s for s in want.documents if s > SAVED and index in want.documents[s]]
    unquarantined = replayed(make, final, (STEPS - 1) * h.C, step_of, SurgeryJournal(journal.skips))
    assert [s for s in unquarantined.documents if s > SAVED and index in unquarantined.documents[s]]


def test_the_ledger_from_the_logs_is_the_ledger_by_replay(runs, tmp_path):
    h, _, recipe, document, (a, _), (b, _) = runs
    shape = ["--framework", "megatron", "--seq-len", str(h.SEQ), "--batch-size", str(h.MBS)]
    state, _ = state_at(b.run_dir, STEPS)
    logs = [f"{r.run_dir}/batches-rank*.log" for r in (a, b)]
    _, table = ledger_both_ways(recipe, Path(state), shape, logs, tmp_path)
    assert sorted(set(table.column("step").to_pylist())) == [s for s in range(1, STEPS + 1) if s != SKIPPED]
    assert all(s <= SAVED for s in steps_holding(table, document)), "quarantined from the resume on"
