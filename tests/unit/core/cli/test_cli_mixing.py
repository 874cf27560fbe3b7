"""The ``zephon`` readers on a steered run's checkpoint (``--journal``, docs/mixing.md): explain, trace,
verify-elastic and report read its mixing journal, and a recipe the journal does not fit is refused."""

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
    from zephon_core.curriculum.controllers import ScheduleController
    from zephon_core.pipeline.mixing import LocalFigures, Mixing, MixingLoader
    from zephon_core.recipe import load_recipe
    from zephon_core.verify.simulate import Phase, run_phase

    recipe = load_recipe(MAIN)
    schedule = [(15, {"examples": 1, "reference": 1, "prose": 2}), (25, {"examples": 6, "reference": 1, "prose": 1})]

    def make(G, g):
        mixing = Mixing(ScheduleController(schedule), interval_steps=5)
        return MixingLoader(recipe.build_standalone(dp_degree=G, dp_group_id=g, prefetch=0), mixing)

    step = [0]

    def after(loaders):
        step[0] += 1
        if loaders[0].due(step[0]):
            figures = LocalFigures.reduced([ld.local_figures() for ld in loaders])
            for ld in loaders:
                ld.decide(step[0], figures)

    records, state = run_phase(make, Phase(2, 30), 8, None, after_step=after)
    path = tmp_path_factory.mktemp("steered") / "step30.json"
    path.write_text(json.dumps(state))
    return path, records


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
