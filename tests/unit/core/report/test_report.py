"""``zephon report`` and ``zephon explain --plot``: the numbers they print and draw, held to a real run.

One run of the bundled three-stage curriculum (configs/data/curriculum.toml, 8 lanes,
resized from 2 to 4 to 8 groups) writes every group's audit log with ``log_line`` and a
merged checkpoint at each resize. The report's totals must equal the logs' lines summed
and the merged checkpoint's tallies; the pictures' data (``figures``, ``plan_figures``)
must equal what the batches held and what the schedule plans. The command line is run
as a user runs it, on files made here.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.cli import zephon

from zephon_core import MemorySource, StaticMixture
from zephon_core.checkpoint.state import parse_lanes
from zephon_core.cli import build_parser
from zephon_core.cli.report import request_of
from zephon_core.integration.batch_log import log_line, read_batch_log
from zephon_core.metrics import sum_tallies
from zephon_core.recipe import load_recipe
from zephon_core.report.figures import run_picture, shares_of, stage_bars, stage_figures
from zephon_core.report.load import load_run, run_figures
from zephon_core.report.plan_figures import plan_picture, planned_step
from zephon_core.verify.shape import Shape, build
from zephon_core.verify.simulate import Phase, run_phase

ROOT = Path(__file__).resolve().parents[4]
RECIPE = ROOT / "configs" / "data" / "curriculum.toml"
PHASES = ((2, 25), (4, 25), (8, 20))
B = 8  # batches per global step = canonical_replicas: one batch of every lane per step


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run: its audit logs, its checkpoints (step-N.json), its per-step records and its final merged state."""
    out = tmp_path_factory.mktemp("run")
    logs, ckpt = out / "logs", out / "ckpt"
    logs.mkdir()
    ckpt.mkdir()
    recipe = load_recipe(RECIPE)
    files = {}

    def log(group, batch):
        files.setdefault(group, open(logs / f"batches-rank{group}.log", "a")).write(log_line(batch))

    state, records, step = None, [], 0
    for groups, steps in PHASES:
        recs, state = run_phase(lambda G, g: build(recipe, Shape(), dp_degree=G, dp_group_id=g, prefetch=0),
                                Phase(groups, steps), B, state, on_batch=log)
        records += recs
        step += steps
        (ckpt / f"step-{step}.json").write_text(json.dumps(state))
    for f in files.values():
        f.close()
    ws = build(recipe, Shape(), prefetch=0).work_source
    return {"logs": logs, "ckpt": ckpt, "records": records, "state": state, "work_source": ws, "out": out}


def report_run(*argv: str):
    return load_run(request_of(build_parser().parse_args(["report", *map(str, argv)])))


def _log_sums(logs: Path, n_stages: int, n_sources: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and documents per stage and source, summed straight from the log lines."""
    tokens, docs = np.zeros((n_stages, n_sources), dtype=np.int64), np.zeros((n_stages, n_sources), dtype=np.int64)
    for path in sorted(logs.glob("*.log")):
        for b in read_batch_log(path):
            for s, n in b.tokens.items():
                tokens[b.stage, s] += n
            for s, n in b.documents.items():
                docs[b.stage, s] += n
    return tokens, docs


def _tokens_per_step(records, n_sources: int) -> np.ndarray:
    """Tokens of each source in each global step, from the rows' provenance (not from the logs)."""
    out = np.zeros((len(records), n_sources), dtype=np.int64)
    for k, r in enumerate(records):
        for row in r.segments:
            for seg in row:
                out[k, seg.source] += seg.stop - seg.start
    return out


def test_totals_from_logs_equal_the_lines_and_the_merged_checkpoints_tallies(run):
    from_logs = report_run(run["logs"], "--recipe", RECIPE)
    from_state = report_run(run["ckpt"] / "step-70.json")
    whole = sum_tallies([ls.tally for ls in parse_lanes(run["state"]).values()], 3, 3)
    tokens, docs = _log_sums(run["logs"], 3, 3)
    assert tokens.sum() > 0 and all(tokens[i].sum() for i in range(3))  # every stage was reached
    for r in (from_logs, from_state):
        assert r.history.tokens[-1].tolist() == whole.tokens == tokens.tolist()
        assert r.history.documents[-1].tolist() == whole.documents == docs.tolist()
        assert int(r.history.batches[-1]) == sum(n for _, n in PHASES) * B
    # Per step, the logs' history is what the batches of that step held.
    per_step = np.diff(from_logs.history.tokens.sum(axis=1), axis=0, prepend=0)
    assert per_step.tolist() == _tokens_per_step(run["records"], 3).tolist()
    assert from_state.history.cut is not None and int(from_state.history.cut[-1]) == whole.cut
    # Where the lanes stand: the stage of each lane's last batch (logs) is its cursor's (checkpoint).
    assert from_logs.lanes_in_stage == from_state.lanes_in_stage and sum(from_state.lanes_in_stage) == 8
    assert (from_logs.entered[2][1] is None) == (from_state.lanes_in_stage[2] < 8)


def test_the_table_compares_each_stage_in_the_unit_its_weights_share(run):
    r = report_run(run["logs"], "--recipe", RECIPE)
    warmup, main, anneal, total = stage_figures(r)
    assert (warmup.weight_by, main.weight_by, total.weight_by) == ("documents", "tokens", None)
    assert warmup.planned.tolist() == pytest.approx([0.0, 0.7, 0.3]) and anneal.planned.tolist() == pytest.approx([0.7, 0.0, 0.3])
    assert warmup.delivered_shares().tolist() == shares_of(warmup.documents).tolist()
    assert main.delivered_shares().tolist() == shares_of(main.tokens).tolist()
    sizes = [len(s) for s in run["work_source"].sources]
    assert total.epochs.tolist() == pytest.approx((total.documents / sizes).tolist())
    assert total.documents.tolist() == sum(st.documents for st in (warmup, main, anneal)).tolist()
    # Audit logs: the steps each stage ran; the first lane into a stage is the first step with its batches.
    assert warmup.first_step == 1 and anneal.last_step == 70 and r.entered[2][0] == anneal.first_step


def test_the_run_picture_draws_each_steps_shares_and_the_stage_boundaries(run):
    r = report_run(run["logs"], "--recipe", RECIPE)
    p = run_picture(r, "run")
    assert p.edges.tolist() == list(range(0, 71)) and p.shares.shape == (3, 70)
    assert np.allclose(p.shares.sum(axis=0), 1.0)
    expected = _tokens_per_step(run["records"], 3)
    assert np.allclose(p.shares.T, expected / expected.sum(axis=1, keepdims=True))
    # A boundary where the first batch of each stage is, from the lines themselves.
    first = {}
    for path in run["logs"].glob("*.log"):
        for b in read_batch_log(path):
            first[b.stage] = min(first.get(b.stage, 10**9), b.lane_index + 1)
    assert [x for x, _ in p.boundaries] == [first[i] - 1 for i in range(3)]
    assert p.boundaries[2][1].startswith(f"anneal from step {first[2]}")
    sizes = np.array([len(s) for s in run["work_source"].sources])
    docs = r.history.documents.sum(axis=1)
    assert p.epochs_of == "epochs" and np.allclose(p.epochs[:, 1:], docs.T / sizes[:, None]) and not p.epochs[:, 0].any()


def test_checkpoints_are_drawn_at_their_steps_and_one_checkpoint_per_stage(run):
    r = report_run(run["ckpt"], "--recipe", RECIPE)
    assert r.history.steps.tolist() == [25, 50, 70]
    p = run_picture(r, "run")
    assert p.edges.tolist() == [0, 25, 50, 70]
    cumulative = r.history.tokens.sum(axis=1)
    assert np.allclose(p.shares.T, shares_of(np.diff(cumulative, axis=0, prepend=0), axis=1))
    assert any("between steps" in label for _, label in p.boundaries)
    one = report_run(run["ckpt"] / "step-70.json")
    bars = stage_bars(one, "one")
    assert bars.units == ["documents", "tokens", "tokens"] and bars.epochs_of == "documents"  # JSONL sizes: not in the state
    assert np.allclose(bars.planned, [s for _, s in run["work_source"].stage_shares()])
    figures = stage_figures(one)
    assert np.allclose(bars.delivered[0], shares_of(figures[0].documents)) and np.allclose(bars.delivered[2], shares_of(figures[2].tokens))


def test_the_plan_picture_is_the_schedule(run):
    ws = run["work_source"]
    per_step = 16 * 129  # global_batch_size rows of seq_len + 1
    p = plan_picture(ws, "plan", tokens_per_step=per_step)
    assert np.allclose(p.shares.sum(axis=0), 1.0) and p.share_of == "tokens"
    for i, (by, shares) in enumerate(ws.stage_shares()):
        if by == "tokens":  # the weights, as whole tokens of a chunk's quota
            quota = np.asarray(ws.schedule.plans[i].per_chunk)
            assert p.shares[:, i].tolist() == (quota / quota.sum()).tolist() and np.allclose(p.shares[:, i], shares, atol=1e-3)
    starts = ws.stage_starts()
    assert np.allclose([x for x, _ in p.boundaries], [planned_step(ws, g, per_step) for g in starts])
    # start_step = 60: the first chunk past 60 steps' tokens, 61.25 steps in. Steps count from 1 and step N is drawn
    # from N - 1 to N, as the run picture draws them ("from step N" at N - 1): that line lies in step 62.
    assert 61 < p.boundaries[2][0] < 62 and p.boundaries[2][1] == "anneal from step 62"
    assert p.boundaries[0] == (0.0, "warmup from step 1")
    assert p.boundaries[1][1] == f"main from step {int(p.boundaries[1][0]) + 1}"
    assert np.all(np.diff(p.epochs, axis=1) >= 0) and np.all(np.diff(p.at) > 0)
    g = starts[2]
    j = int(np.flatnonzero(np.isclose(p.at, planned_step(ws, g, per_step)))[0])
    assert p.epochs[:, j].tolist() == pytest.approx([ws.schedule.position(s, g) / len(ws.sources[s]) for s in range(3)])
    # A static mixture plans documents only: its picture is over chunks, shares of documents.
    static = StaticMixture([MemorySource([[1]] * 30, name="a"), MemorySource([[2]] * 10, name="b")], [3, 1], chunk_size=8)
    q = plan_picture(static, "static", tokens_per_step=per_step)
    assert q.share_of == "documents" and q.x_label == "global chunk" and q.shares[:, 0].tolist() == [0.75, 0.25]
    assert q.epochs[:, -1].tolist() == pytest.approx([6 * q.at[-1] / 30, 2 * q.at[-1] / 10])


def test_report_from_the_command_line_with_a_picture_and_a_page(run, tmp_path):
    png, page = tmp_path / "run.png", tmp_path / "run.html"
    r = zephon("report", str(run["logs"]), "--recipe", str(RECIPE), "--plot", str(png), "--html", str(page))
    assert r.returncode == 0, r.stderr
    whole = sum_tallies([ls.tally for ls in parse_lanes(run["state"]).values()], 3, 3)
    assert f"total: {sum(map(sum, whole.tokens)):,} tokens" in r.stdout
    assert "stage 2 'anneal' (weight_by=tokens)" in r.stdout and "lanes now in stage: main 1, anneal 7" in r.stdout
    assert re.search(r"^  examples .*\+?-?\d+\.\d pt +\d\.\d{3}$", r.stdout, re.MULTILINE)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.read_text()
    assert "data:image/png;base64," in text and "<table>" in text and "anneal" in text
    assert "http" not in text and "url(" not in text
    assert all(src.startswith("data:") for src in re.findall(r'src="([^"]*)"', text))
    # The title (what was read) heads the page once: not again in the lines under it, nor in its picture.
    read = report_run(run["logs"], "--recipe", RECIPE)
    body = text.split("<body>")[1]
    assert body.count(html.escape(read.read)) == 1 and f"<h1>run: {html.escape(read.read)}</h1>" in body
    assert run_figures(read, "")[0].get_suptitle() == "" and run_figures(read, "t")[0].get_suptitle() == "t"


def test_a_checkpoint_without_sizes_says_how_to_get_epochs(run, tmp_path):
    png = tmp_path / "one.png"
    r = zephon("report", str(run["ckpt"] / "step-70.json"), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert "epochs: ? for examples, reference, prose" in r.stdout and "pass --recipe" in r.stdout
    assert "truncation: " in r.stdout and "% of row stretches" in r.stdout and png.exists()
    r = zephon("report", str(run["ckpt"] / "step-70.json"), "--recipe", str(RECIPE))
    assert "epochs: ?" not in r.stdout and "sizes from" in r.stdout


def test_bad_input_is_refused_in_one_line_naming_it(run, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("this is not a state\n")
    r = zephon("report", str(notes))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert f"{notes}: neither a batch audit log nor a checkpoint state" in r.stderr
    r = zephon("report", str(run["logs"] / "batches-rank0.log"), str(run["ckpt"] / "step-25.json"))
    assert r.returncode == 1 and "not both" in r.stderr
    other = tmp_path / "other"
    other.mkdir()
    first = (run["logs"] / "batches-rank0.log").read_text().splitlines()[0].split()
    (other / "a.log").write_text(" ".join(first) + "\n")
    (other / "b.log").write_text(" ".join([*first[:2], "0" * 32, *first[3:]]) + "\n")
    r = zephon("report", str(other))
    assert r.returncode == 1 and "logs are of different runs" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    (other / "b.log").write_text(" ".join(first[:3]) + "\n")
    r = zephon("report", str(other))
    assert r.returncode == 1 and "first format" in r.stderr
    # A recipe that is not the run's is refused, not used to name and size the wrong sources.
    demo = ROOT / "configs" / "data" / "demo.toml"
    r = zephon("report", str(run["ckpt"] / "step-25.json"), "--recipe", str(demo))
    assert r.returncode == 1 and "its sources are not those of the checkpoint" in r.stderr
    r = zephon("report", str(run["logs"]), "--recipe", str(demo))
    assert r.returncode == 1 and "pass the run's recipe" in r.stderr


def test_duplicated_logs_count_once_and_missing_ones_are_noted(run, tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(run["logs"], logs)
    shutil.copy(logs / "batches-rank0.log", logs / "batches-rank0-tp1.log")  # a tensor-parallel peer logs the same batches
    whole = report_run(run["logs"], "--recipe", RECIPE)
    assert report_run(logs, "--recipe", RECIPE).history.tokens.tolist() == whole.history.tokens.tolist()
    (logs / "batches-rank0-tp1.log").unlink()
    (logs / "batches-rank3.log").unlink()  # written from step 26 on, by a group of the 4- and 8-group phases
    partial = report_run(logs, "--recipe", RECIPE)
    assert any("hold fewer than 8 batches (first: step 26)" in n for n in partial.notes)


def test_a_missing_matplotlib_names_the_plot_extra(run, tmp_path):
    fake = tmp_path / "fake" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n")
    env_path = f"{tmp_path / 'fake'}:{ROOT}"
    r = subprocess.run([sys.executable, "-m", "zephon_core.cli", "report", str(run["ckpt"]),
                        "--plot", str(tmp_path / "x.png")],
                       capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": env_path})
    assert r.returncode == 1 and "pip install 'zephon-suite[plot]'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == "", r.stdout  # checked first: no table printed before the failure
    explain = ["explain", str(RECIPE), "--plot", str(tmp_path / "x.png")]
    r = subprocess.run([sys.executable, "-m", "zephon_core.cli", *explain], capture_output=True, text=True, timeout=300,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": env_path})
    assert r.returncode == 1 and "pip install 'zephon-suite[plot]'" in r.stderr and r.stdout == "", r.stdout + r.stderr


def test_explain_plot_draws_the_plan(tmp_path):
    png = tmp_path / "plan.png"
    r = zephon("explain", str(RECIPE), "--plot", str(png), "--plot-steps", "80")
    assert r.returncode == 0, r.stderr
    assert "stage 2 'anneal'" in r.stdout and f"wrote {png}" in r.stdout and png.read_bytes()[:4] == b"\x89PNG"


def test_the_docs_figures_regenerate(tmp_path):
    """docs/img/watch_plan.png and watch_report.png come from `python scripts/watch_figures.py` (docs/cli.md)."""
    assert "python scripts/watch_figures.py" in (ROOT / "docs" / "cli.md").read_text()
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "watch_figures.py"), str(tmp_path)], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "stage 2 'anneal'" in r.stdout
    for name in ("watch_plan.png", "watch_report.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_the_plan_ends_at_the_step_asked_for():
    """--plot-steps 30: the last chunk drawn reaches past step 30 (it ends at ~30.9), the axis ends at 30."""
    from zephon_core.report.load import plan_of

    p = build(load_recipe(RECIPE), Shape(), prefetch=0)
    picture = plan_of(p, title="plan", global_batch_size=16, plot_steps=30)
    assert picture.edges[-1] == 30.0 and picture.edges[-2] < 30 and picture.at[-1] >= 30
    assert [label for _, label in picture.boundaries] == ["warmup from step 1", "main from step 10"]
    demo = build(load_recipe(ROOT / "configs" / "data" / "demo.toml"), Shape(), prefetch=0)
    chunks = plan_of(demo, title="c", plot_steps=30)
    assert chunks.edges[-1] == 30.0 and chunks.x_label == "global chunk"


def test_stage_labels_at_one_point_each_get_a_column_inside_the_panel():
    """Two stages first seen at the same step (a short run): one line, each label on its own, none past the panel."""
    from zephon_core.report.figures import Picture
    from zephon_core.report.plots import draw_picture

    long = ["warmup by step 12 (every lane by 12, then some words)", "main by step 12 (every lane by 12, then more)"]
    p = Picture("t", ["a", "b"], "global step", np.array([0.0, 12, 16]), np.array([[0.5, 0.4], [0.5, 0.6]]), "tokens",
                np.array([0.0, 12, 16]), np.array([[0, 0.1, 0.2], [0, 0.2, 0.3]]), "epochs",
                [(0.0, long[0]), (0.0, long[1]), (12.0, "anneal from step 13")])
    fig = draw_picture(p)
    fig.draw_without_rendering()
    share_ax = fig.axes[0]
    texts = [t for t in share_ax.texts if t.get_text().strip()]
    assert [t.get_text().split("\n") for t in texts] == [[" " + long[0], " " + long[1]], [" anneal from step 13"]]
    panel = share_ax.get_window_extent()
    for t in texts:
        box = t.get_window_extent()
        assert panel.y0 <= box.y0 and box.y1 <= panel.y1, (t.get_text(), box, panel)
