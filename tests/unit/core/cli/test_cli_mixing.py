"""The ``zephon`` readers on a steered run's checkpoint (``--journal``, docs/mixing.md): explain, trace,
verify-elastic and report read its mixing journal, and a recipe the journal does not fit is refused; quarantine,
ledger and diff rebuild the run with the state's journal replayed (``with_history``, issue #40 item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import zephon as cli

ROOT = Path(__file__).resolve().parents[4]
MAIN = ROOT / "configs" / "data" / "curriculum_main.toml"  # warm-up and main
FULL = ROOT / "configs" / "data" / "curriculum.toml"  # the same with an anneal stage at step 60


@pytest.fixture(scope="module")
def steered(tmp_path_factory):
    """The merged state of curriculum_main.toml steered by a schedule on 2 groups for 30 global steps of 8 batches,
    and the row digests of each step."""
    from zephon_core.verify.simulate import Phase, run_phase

    records, state = run_phase(_loader, Phase(2, 30), 8, None, after_step=_deciding(0))
    path = tmp_path_factory.mktemp("steered") / "step30.json"
    path.write_text(json.dumps(state))
    return path, records


SCHEDULE = [(15, {"examples": 1, "reference": 1, "prose": 2}), (25, {"examples": 6, "reference": 1, "prose": 1})]


def _loader(G: int, g: int):
    """A group's pipeline of curriculum_main.toml, steered by ``SCHEDULE`` every 5 steps."""
    from zephon_core.curriculum.controllers import ScheduleController
    from zephon_core.pipeline.mixing import Mixing, MixingLoader
    from zephon_core.recipe import load_recipe

    return MixingLoader(load_recipe(MAIN).build_standalone(dp_degree=G, dp_group_id=g, prefetch=0),
                        Mixing(ScheduleController(SCHEDULE), interval_steps=5))


def _deciding(first: int):
    """``run_phase``'s after_step for steered loaders whose global steps count on from ``first``."""
    from zephon_core.pipeline.mixing import LocalFigures

    step = [first]

    def after(loaders):
        step[0] += 1
        if loaders[0].due(step[0]):
            figures = LocalFigures.reduced([ld.local_figures() for ld in loaders])
            for ld in loaders:
                ld.decide(step[0], figures)
    return after


def _parts(segments) -> list[str]:
    names = ["examples", "reference", "prose"]
    return sorted(f"{names[s.source]}#{s.document}[{s.start}:{s.stop}]" for row in segments for s in row)


def test_explain_and_report_print_the_journal(steered):
    path, _ = steered
    r = cli("explain", str(MAIN), "--journal", str(path))
    assert r.returncode == 0, r.stderr
    assert "mixing journal: 2 decision(s), weight_by=tokens" in r.stdout
    assert "stage 2 'mix0'" in r.stdout and "stage 3 'mix1'" in r.stdout
    assert "mix1: step 25 -> chunk" in r.stdout and "examples 0.75, prose 0.125, reference 0.125 (schedule" in r.stdout
    assert "; loss per token: examples -, prose -, reference -" in r.stdout  # this run recorded no loss
    rep = cli("report", str(path))
    assert rep.returncode == 0, rep.stderr
    assert "note: mixing journal: 2 decision(s)" in rep.stdout and "mix0" in rep.stdout


def test_trace_and_verify_elastic_replay_the_journal(steered):
    path, records = steered
    r = cli("trace", str(MAIN), "--journal", str(path), "--step", "30", "--canonical-replicas", "8")
    assert r.returncode == 0, r.stderr
    assert "stage 'mix0'" in r.stdout and "no document repeated within a source epoch" in r.stdout
    names = ["examples", "reference", "prose"]
    ran = sorted(f"{names[s.source]}#{s.document}[{s.start}:{s.stop}]" for row in records[29].segments for s in row)
    traced = sorted(part for line in r.stdout.splitlines() if line.strip().startswith("row ")
                    for part in line.split(": ", 1)[1].split(", "))
    assert traced == ran  # the step the steered run trained on, documents and token ranges
    v = cli("verify-elastic", str(MAIN), "--journal", str(path), "--canonical-replicas", "8", "--from", "8",
            "--to", "2", "--checkpoint-step", "20", "--steps", "34")
    assert v.returncode == 0, v.stdout + v.stderr
    assert v.stdout.startswith("ok: 34 global steps identical")


def test_a_recipe_the_journal_does_not_fit_is_refused(steered):
    path, _ = steered
    r = cli("trace", str(FULL), "--journal", str(path), "--step", "3", "--canonical-replicas", "8")
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1 and "mix0" in r.stderr, r.stderr


def test_quarantine_edits_a_steered_state_and_the_run_resumes_from_it(steered, tmp_path):
    """A steered run's state is quarantined like any other (it was refused: 'resume with mixing on'); the steered
    run resumes from the new state and leaves the document out, everything else as it was."""
    from zephon_core.checkpoint.surgery import surgery_journal_of
    from zephon_core.verify.simulate import Phase, run_phase

    path, _ = steered
    state = json.loads(path.read_text())
    ahead, _ = run_phase(_loader, Phase(2, 20), 8, state, after_step=_deciding(30))
    seen_before = {p.split("[")[0] for r in ahead[:-1] for p in _parts(r.segments)}
    late = sorted({p.split("[")[0] for p in _parts(ahead[-1].segments)} - seen_before)[0]  # first read at step 50
    out = tmp_path / "quarantined.json"
    r = cli("quarantine", str(MAIN), "--state", str(path), "--document", late, "--out", str(out))
    assert r.returncode == 0, r.stderr
    new = json.loads(out.read_text())
    assert [str(q) for q in surgery_journal_of(new).quarantines] == [late]
    assert new["definition"] == state["definition"] and new["lanes"] == state["lanes"]  # the journal stays whole
    resumed, _ = run_phase(_loader, Phase(2, 20), 8, new, after_step=_deciding(30))
    assert not any(p.startswith(late + "[") for r in resumed for p in _parts(r.segments))
    assert _parts(resumed[0].segments) == _parts(ahead[0].segments)  # chunks begun before the state: unchanged


def test_a_recipe_the_journal_does_not_fit_is_refused_naming_the_state(steered):
    path, _ = steered
    r = cli("quarantine", str(FULL), "--state", str(path), "--document", "examples#1", "--out", str(path) + ".q")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{path}: the state's mixing journal does not replay over the recipe's mixture: " in r.stderr
    assert "use the recipe of the run that wrote the state" in r.stderr


def test_the_ledger_of_a_steered_state_is_what_the_run_trained_on(steered):
    path, records = steered
    r = cli("ledger", str(MAIN), "--state", str(path), "--step", "30")
    assert r.returncode == 0, r.stderr
    rows = sorted(line.split()[4] for line in r.stdout.splitlines() if line.startswith("  "))
    assert rows == _parts(records[29].segments)  # the steered step, not the recipe's own mixture


def test_diff_replays_the_journal_for_a_recipe_that_steers(steered, tmp_path):
    """A recipe with a ``[mixing]`` table resumes a steered state (its journal replayed): accepted; the same recipe
    without the table is refused, saying to resume with mixing on."""
    path, _ = steered
    text = MAIN.read_text().replace('"../corpus/', f'"{MAIN.parent.parent / "corpus"}/')
    steering = tmp_path / "steering.toml"
    steering.write_text(text + '\n[mixing]\ncontroller = "identity"\ninterval_steps = 5\n')
    r = cli("diff", str(path), str(steering))
    assert r.returncode == 0 and r.stdout.startswith("accepted: same data definition"), r.stdout + r.stderr
    r = cli("diff", str(path), str(MAIN))
    assert r.returncode == 1 and "resume with mixing on" in r.stdout, r.stdout + r.stderr
