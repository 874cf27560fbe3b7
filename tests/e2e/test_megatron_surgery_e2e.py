"""Skipping the steps after a spike under Megatron-LM, proven by launches (issue #35).

Four launches of the wheel entry on CPU (tiny GPT, 4 micro-batches a step, 4 lanes, 8 iterations), all with
TP=2, so half the ranks build no pipeline and must still run Megatron's dummy step for exactly the skipped steps:

* ``ref``:     TP=2 x DP=2, uninterrupted, a checkpoint every 3 iterations; the "spike" is at iteration ``S`` = 4;
* ``skipped``: TP=2 x DP=2 from ``ref``'s iteration-3 checkpoint with the recipe's ``[surgery] skip_steps = ["4..5"]``;
* ``resized``: TP=2 x DP=1 from ``skipped``'s iteration-6 checkpoint, the table still in the recipe;
* ``flag``:    TP=2 x DP=2 from ``ref``'s iteration-3 checkpoint with Megatron's ``--iterations-to-skip 4 5`` instead.

Checked against the batch audit logs (``ZEPHON_BATCH_LOG``), step by step: the iterations after the skip hold
what ``ref``'s hold, Megatron trains no iteration 4 or 5, the journal is written once and the same both ways,
and ``zephon ledger`` on the last loader state agrees with the logs of the runs that trained each step.
"""

from __future__ import annotations

import pytest
from harnesses import load
from support.cli import zephon

from zephon_core.checkpoint.surgery import Skip, surgery_journal_of

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not __import__("importlib").util.find_spec("megatron"),
                                                  reason="megatron-core is not installed")]
h = load("megatron")
S, K = 4, 1  # the spike's iteration; steps S..S+K are skipped
LAST = 8
JOURNALED = "zephon: {}: steps 4..5 skipped (4 batches a step), journaled in the loader state"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("megatron.core.datasets.indexed_dataset")  # make_assets writes .bin/.idx in this process
    root = tmp_path_factory.mktemp("mg-surgery")
    assets = h.make_assets(root / "assets")
    recipe = assets.indexed_recipe.with_name("mg_e2e_surgery.toml")  # beside its sources: their paths are relative
    recipe.write_text(assets.indexed_recipe.read_text() + f'\n[surgery]\nskip_steps = ["{S}..{S + K}"]\n')
    Z = h.Zrun
    out = {"recipe": recipe, "plain": assets.indexed_recipe}

    def launch(name: str, z: h.Zrun) -> h.RunResult:
        r = h.run(root, name, z, timeout=300)
        print(f"[megatron surgery e2e] {name}: rc={r.returncode} {r.wall_s:.0f}s")
        assert r.ok, f"{name} failed (rc={r.returncode}):\n{r.log_tail()}"
        return r

    ref = out["ref"] = launch("ref", Z("wheel", 4, assets.indexed_recipe, tp=2, train_iters=LAST, save_interval=3))
    from_ref = dict(tp=2, train_iters=LAST, save_interval=3, load=ref.run_dir / "ckpt", load_step=3,
                    loader_states_from=ref.run_dir / "loader")
    skipped = out["skipped"] = launch("skipped", Z("wheel", 4, recipe, **from_ref))
    out["resized"] = launch("resized", Z("wheel", 2, recipe, tp=2, train_iters=LAST, save_interval=2,
                                         load=skipped.run_dir / "ckpt", load_step=6,
                                         loader_states_from=skipped.run_dir / "loader"))
    out["flag"] = launch("flag", Z("wheel", 4, assets.indexed_recipe, **from_ref,
                                   extra=["--iterations-to-skip", str(S), str(S + 1)]))
    return out


def state_file(run: h.RunResult, iteration: int) -> str:
    from zephon_megatron.state import find_state_file

    path = find_state_file(str(run.run_dir / "loader"), iteration, 0, pipeline_parallel=False)
    assert path is not None, f"no loader state of iteration {iteration} in {run.run_dir}"
    return path


def journal(run: h.RunResult, iteration: int):
    from zephon_megatron.state import read_loader_file

    return surgery_journal_of(read_loader_file(state_file(run, iteration)).state)


def test_the_steps_after_the_skip_hold_what_the_uninterrupted_runs_steps_hold(runs):
    ref, skipped = runs["ref"].steps(), runs["skipped"].steps()
    assert sorted(ref) == list(range(1, LAST + 1))
    assert sorted(skipped) == [6, 7, 8] and all(skipped[s] == ref[s] for s in skipped)
    # Megatron ran its dummy step for 4 and 5 on every rank: no loss logged, the iteration counter moved on.
    assert sorted(runs["skipped"].logged_losses) == [6, 7, 8]
    assert runs["skipped"].text.count(JOURNALED.format(f"{runs['recipe']}: surgery")) == 1


def test_a_resume_on_another_dp_degree_keeps_them_and_journals_nothing_twice(runs):
    ref, resized = runs["ref"].steps(), runs["resized"].steps()
    assert sorted(resized) == [7, 8] and all(resized[s] == ref[s] for s in resized)
    assert "journaled in the loader state" not in runs["resized"].text
    assert journal(runs["skipped"], 6).skips == journal(runs["resized"], LAST).skips == (Skip(S, S + K, 1),)


def test_megatrons_own_flag_gives_the_same_batches_and_the_same_journal(runs):
    assert runs["flag"].steps() == runs["skipped"].steps()
    assert sorted(runs["flag"].logged_losses) == [6, 7, 8]
    assert runs["flag"].text.count(JOURNALED.format("--iterations-to-skip")) == 1
    assert journal(runs["flag"], LAST) == journal(runs["skipped"], LAST) == journal(runs["resized"], LAST)


def test_the_ledger_agrees_with_the_audit_logs_on_every_step(runs, tmp_path):
    import pyarrow.parquet as pq

    trained = {**{s: b for s, b in runs["ref"].steps().items() if s < S}, **runs["skipped"].steps(),
               **runs["resized"].steps()}  # each step from the run that trained it, as a resumed run's history is
    logs = [str(runs[n].run_dir / "batches-rank*.log") for n in ("ref", "skipped", "resized")]
    out = tmp_path / "ledger.parquet"
    r = zephon("ledger", str(runs["plain"]), "--state", state_file(runs["resized"], LAST), "--batches-per-step", "4",
               "--framework", "megatron", "--seq-len", str(h.SEQ), "--batch-size", str(h.MBS), "--logs", *logs,
               "--parquet", str(out))
    assert r.returncode == 0 and "batch logs (10 files): the ledger built from them" in r.stdout, r.stdout + r.stderr
    table = pq.read_table(out, columns=["step", "lane", "lane_index"]).to_pydict()
    ledger: dict[int, set[tuple[int, int]]] = {}
    for step, lane, index in zip(table["step"], table["lane"], table["lane_index"]):
        ledger.setdefault(step, set()).add((lane, index))
    assert ledger == {s: set(b) for s, b in trained.items()}
    assert sorted(ledger) == [1, 2, 3, 6, 7, 8]
