"""``zephon report --plot`` on a steered run (docs/mixing.md): the series the picture draws are the journal's weights
and losses and the shares the audit logs (or the checkpoint's per-stage tallies) hold. One run of
curriculum_main.toml steered by a schedule on 2 groups writes every group's audit log and its last state."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from support.cli import zephon

from zephon_core.curriculum.controllers import ScheduleController
from zephon_core.curriculum.journal import DENOMINATOR
from zephon_core.integration.batch_log import log_line
from zephon_core.pipeline.mixing import LocalFigures, Mixing, MixingLoader
from zephon_core.recipe import load_recipe
from zephon_core.report.load import ReportRequest, load_run
from zephon_core.report.mixing_figures import bin_width, mixing_picture
from zephon_core.verify.simulate import Phase, run_phase

ROOT = Path(__file__).resolve().parents[4]
MAIN = ROOT / "configs" / "data" / "curriculum_main.toml"
NAMES = ["examples", "reference", "prose"]
LOSS = [2.0, 3.0, 2.5]  # a stand-in loss per token of each source
STEPS = 50


@pytest.fixture(scope="module")
def steered(tmp_path_factory):
    """The audit logs (a folder), the state at step 50, and each step's tokens per source as the batches held."""
    out = tmp_path_factory.mktemp("steered")
    logs = out / "logs"
    logs.mkdir()
    recipe = load_recipe(MAIN)
    schedule = [(10, {"examples": 1, "reference": 1, "prose": 2}), (30, {"examples": 6, "reference": 1, "prose": 1})]
    files, per_step, step = {}, [Counter()], [0]

    def log(group, batch):
        files.setdefault(group, open(logs / f"batches-rank{group}.log", "a")).write(log_line(batch))
        for _, source, _, start, stop in batch.segments.tolist():
            per_step[-1][source] += stop - start

    def make(G, g):
        return MixingLoader(recipe.build_standalone(dp_degree=G, dp_group_id=g, prefetch=0),
                            Mixing(ScheduleController(schedule), interval_steps=10))

    def after(loaders):
        step[0] += 1
        counts = [per_step[-1][s] for s in range(3)]
        for ld in loaders:
            ld.record_loss([n * LOSS[s] / step[0] for s, n in enumerate(counts)], counts)
        per_step.append(Counter())
        if loaders[0].due(step[0]):
            figures = LocalFigures.reduced([ld.local_figures() for ld in loaders])
            for ld in loaders:
                ld.decide(step[0], figures)

    _, state = run_phase(make, Phase(2, STEPS), 8, None, on_batch=log, after_step=after)
    for f in files.values():
        f.close()
    path = out / "step-50.json"
    path.write_text(json.dumps(state))
    tokens = np.array([[c[s] for s in range(3)] for c in per_step[:-1]])
    return logs, path, state, tokens


def test_the_picture_of_the_logs_draws_the_journal_and_the_shares_the_batches_held(steered):
    logs, path, _, tokens = steered
    run = load_run(ReportRequest((str(logs),), str(MAIN), journal=str(path)))
    journal = run.journal
    assert [d.step for d in journal.decisions] == [10, 30]
    p = mixing_picture(run, journal, "t")
    assert p.sources == NAMES and p.share_of == "tokens"
    # The weights: the recipe's stages from the step their first lane entered, then each decision from its step.
    assert [name for _, _, name in p.spans] == ["warmup", "main", "mix0", "mix1"]
    assert [a for a, _, _ in p.spans][2:] == [10.0, 30.0] and p.spans[-1][1] == STEPS
    for j, d in enumerate(journal.decisions):
        assert p.weights[:, 2 + j].tolist() == [d.weights[n] / DENOMINATOR for n in NAMES]
    assert p.weights[:, 1].tolist() == pytest.approx([0.4, 0.3, 0.3])
    # The realized shares: the tokens of each bin of 20 steps (the gap between the decisions), as the batches held.
    assert bin_width(journal, STEPS) == 20 and p.realized_edges.tolist() == [0, 20, 40, 50]
    for k, (a, b) in enumerate(zip([0, 20, 40], [20, 40, 50])):
        held = tokens[a:b].sum(axis=0)
        assert p.realized[:, k] == pytest.approx(held / held.sum(), abs=1e-12)
    # The losses: what each decision saw, its interval's mean loss (the stand-in falls as 1 / step).
    for n, d in enumerate(journal.decisions):
        steps = range(d.step - 9, d.step + 1)
        for s in range(3):
            mean = sum(tokens[t - 1][s] * LOSS[s] / t for t in steps) / sum(tokens[t - 1][s] for t in steps)
            assert p.losses[s][n] == pytest.approx(mean, rel=1e-5) and p.losses[s][n] == d.mean_loss(NAMES[s])


def test_the_picture_of_a_checkpoint_draws_each_stage_s_tallies(steered):
    _, path, state, _ = steered
    run = load_run(ReportRequest((str(path),)))
    p = mixing_picture(run, run.journal, "t")
    assert [name for _, _, name in p.spans] == ["mix0", "mix1"]  # the recipe's stages: no steps in a checkpoint
    assert p.realized_edges.tolist() == [10, 30, 50]
    for j, stage in enumerate((2, 3)):  # the decided stages come after the recipe's warmup and main
        rows = [lane["tally"]["tokens"] for lane in state["lanes"].values()]  # a lane's rows: the stages it reached
        delivered = np.array([sum(t[stage][s] for t in rows if stage < len(t)) for s in range(3)])
        assert delivered.sum() > 0
        assert p.realized[:, j] == pytest.approx(delivered / delivered.sum(), abs=1e-12)
    assert any("recipe's stages (warmup, main) are not drawn" in n for n in p.notes)


def test_report_plots_a_steered_run_and_refuses_a_journal_it_cannot_use(steered, tmp_path):
    logs, path, _, _ = steered
    png, page = tmp_path / "mix.png", tmp_path / "mix.html"
    r = zephon("report", str(logs), "--recipe", str(MAIN), "--journal", str(path), "--plot", str(png),
               "--html", str(page))
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:4] == b"\x89PNG" and page.read_text().count("data:image/png;base64,") == 2
    last = load_run(ReportRequest((str(path),))).journal.decisions[-1]
    assert f"mix1: step 30 -> chunk {last.start_chunk}" in r.stdout  # the journal under the logs' table, with why
    assert f"; loss per token: examples {last.mean_loss('examples'):.4g}, prose " in r.stdout
    assert zephon("report", str(path), "--plot", str(png)).returncode == 0
    bad = zephon("report", str(path), "--journal", str(path))
    assert bad.returncode == 1 and "--journal is for audit logs" in bad.stderr
    plain = tmp_path / "plain.json"
    pipeline = load_recipe(MAIN).build_standalone(prefetch=0)
    next(iter(pipeline))
    plain.write_text(json.dumps(pipeline.checkpoint()))
    pipeline.close()
    wrong = zephon("report", str(logs), "--journal", str(plain))
    assert wrong.returncode == 1 and "holds no mixing journal (not a steered run)" in wrong.stderr, wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1


def test_the_docs_mixing_figure_regenerates(tmp_path):
    """docs/img/mixing_report.png comes from `python scripts/mixing_figure.py` (docs/mixing.md)."""
    assert "python scripts/mixing_figure.py" in (ROOT / "docs" / "mixing.md").read_text()
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "mixing_figure.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "stage 2 'mix0'" in r.stdout
    assert (tmp_path / "mixing_report.png").read_bytes()[:4] == b"\x89PNG"
