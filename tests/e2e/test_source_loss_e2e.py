"""Per-source training loss in a real training loop under torchrun on CPU (issue #34).

TorchTitan 0.3 at dp=2 over three sources (``runs.mixed_recipe``) with ``source_loss``: every logged
step's ``zephon/loss/<source>`` weighted by ``zephon/loss_tokens/<source>`` is TorchTitan's own
``global_avg_loss`` (a sum over both ranks' tokens: the figures are reduced over the data-parallel
group), the token counts are those of the batch audit log's rows, and the console shows the same means.
Megatron's wheel entry at TP=2 x DP=2 with ``--zephon-source-loss``: the same sums against its ``lm loss``.
At PP=2 x DP=2 the first stage's rank 0 prints the figures the last stage's broadcast gave it.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from support.tensorboard_events import scalars
from torchtitan_cpu.runs import GLOBAL_BATCH, LOCAL_BATCH, SEQ_LEN, launch, mixed_recipe

from zephon_core.integration.batch_log import read_batch_log

pytestmark = pytest.mark.e2e
NAMES = ("examples", "reference", "prose")
STEPS = 4


@pytest.fixture(scope="module")
def torchtitan_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tt-source-loss")
    dump = root / "run"
    r = launch("0.3", 2, dump, steps=STEPS, metrics=True, source_loss=True, loader={"recipe": str(mixed_recipe(root))})
    return r, dump


def test_torchtitan_logs_each_sources_loss_and_they_add_up_to_the_loss(torchtitan_run):
    r, dump = torchtitan_run
    ev = scalars(dump / "tb")
    steps = range(1, STEPS + 1)
    assert sorted(ev["loss_metrics/global_avg_loss"]) == list(steps)
    for step in steps:
        tokens = {n: ev[f"zephon/loss_tokens/{n}"][step] for n in NAMES}
        assert sum(tokens.values()) == GLOBAL_BATCH * SEQ_LEN, "concat rows: every label counts"
        weighted = sum(ev[f"zephon/loss/{n}"][step] * t for n, t in tokens.items() if t)
        assert weighted / sum(tokens.values()) == pytest.approx(ev["loss_metrics/global_avg_loss"][step], rel=1e-4)
    assert all(len(ev.get(f"zephon/loss/{n}", {})) >= 2 for n in NAMES), "each source should be trained"

    # The audit log's rows: a row's L + 1 tokens less its first (which is no label), per source and step.
    per_step = GLOBAL_BATCH // LOCAL_BATCH // 2
    audit = [list(read_batch_log(f)) for f in sorted(dump.glob("batches-rank*.log"))]
    for step in steps:
        rows = Counter()
        for batches in audit:
            for b in batches[(step - 1) * per_step: step * per_step]:
                rows.update(b.tokens)
        for i, n in enumerate(NAMES):
            logged = ev[f"zephon/loss_tokens/{n}"][step]
            assert rows[i] - GLOBAL_BATCH <= logged <= rows[i], (step, n, logged, rows[i])

    # The console line after each of TorchTitan's (the harness keeps rank 0's console) shows the same means.
    lines = re.findall(r"zephon: loss by source (.*)", r.log_text())
    assert len(lines) == STEPS
    for step, line in zip(steps, lines):
        shown = dict(pair.split("=") for pair in line.split())
        for n in NAMES:
            want = ev.get(f"zephon/loss/{n}", {}).get(step)
            assert shown[n] == ("-" if want is None else f"{want:.5f}")


def test_under_pipeline_parallelism_the_first_stage_holds_the_last_stages_figures(tmp_path):
    """PP=2 (dp=1): only rank 1, the last stage, computes a loss; rank 0 prints (the harness keeps its console)
    what the broadcast from the last stage gave it, which is what rank 1 wrote to TensorBoard, and the token-weighted
    means are TorchTitan's loss there. Step 1 checks that of the two losses torch's 1F1B schedule computes for the
    first micro-batch in its first step, the training step's counts, once."""
    dump = tmp_path / "pp"
    r = launch("0.3", 2, dump, steps=3, metrics=True, source_loss=True, loader={"recipe": str(mixed_recipe(tmp_path))},
               extra=["--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule", "1F1B",
                      "--training.disable_cuda_graphs"])
    ev = scalars(dump / "tb")
    lines = re.findall(r"zephon: loss by source (.*)", r.log_text())
    assert len(lines) == 3
    for step, line in zip((1, 2, 3), lines):
        shown = dict(pair.split("=") for pair in line.split())
        tokens = {n: ev[f"zephon/loss_tokens/{n}"][step] for n in NAMES}
        assert sum(tokens.values()) == GLOBAL_BATCH * SEQ_LEN
        for n in NAMES:
            want = ev.get(f"zephon/loss/{n}", {}).get(step)
            assert shown[n] == ("-" if want is None else f"{want:.5f}")
        weighted = sum(ev[f"zephon/loss/{n}"][step] * t for n, t in tokens.items() if t)
        assert weighted / sum(tokens.values()) == pytest.approx(ev["loss_metrics/global_avg_loss"][step], rel=1e-4)


MEGATRON = pytest.mark.skipif(not __import__("importlib").util.find_spec("megatron"),
                              reason="megatron-core is not installed")
MG_NAMES = ("examples", "prose", "reference")


def megatron_run(tmp_path, name, **topology):
    """Megatron's wheel entry over three token-array sources with --zephon-source-loss for 4 iterations."""
    from harnesses import load
    from torchtitan_cpu.runs import token_corpora

    h = load("megatron")
    token_corpora(tmp_path)
    recipe = tmp_path / "mixed.toml"
    recipe.write_text(f"seed = 11\nchunk_size = 4\ncanonical_replicas = {h.C}\n\n[shuffle]\nwindow = 4\nseed = 2\n\n"
                      + "".join(f'[[sources]]\nname = "{n}"\npath = "{n}.npy"\nformat = "token_array"\n'
                                f'offsets = "{n}_offsets.npy"\n\n' for n in MG_NAMES))
    r = h.run(tmp_path, name, h.Zrun("wheel", 4, recipe, train_iters=4, **topology,
                                     extra=["--zephon-source-loss", "--tensorboard-dir", "tb"]))
    assert r.ok, r.log_tail()
    return h, r, scalars(r.run_dir / "tb")


def assert_weighted_means_are_lm_loss(h, ev):
    for step in range(1, 5):
        tokens = {n: ev[f"zephon/loss_tokens/{n}"][step] for n in MG_NAMES}
        assert sum(tokens.values()) == h.GBS * h.SEQ, "concat rows: every label counts once"
        weighted = sum(ev[f"zephon/loss/{n}"][step] * t for n, t in tokens.items() if t)
        assert weighted / sum(tokens.values()) == pytest.approx(ev["lm loss"][step], rel=1e-4)


@MEGATRON
def test_megatron_logs_each_sources_loss_and_they_add_up_to_the_loss(tmp_path):
    """Megatron's wheel entry at TP=2 x DP=2 over three token-array sources with --zephon-source-loss: the last rank
    writes zephon/loss/<source> beside Megatron's lm loss at every iteration; weighted by their tokens the means are
    Megatron's loss (the figures are reduced over the data-parallel group), and every label token counts once."""
    h, r, ev = megatron_run(tmp_path, "mg", tp=2)
    assert_weighted_means_are_lm_loss(h, ev)
    assert len(re.findall(r"zephon: loss by source .* \| iteration \d+", r.text)) == 4


@MEGATRON
def test_megatron_under_pipeline_parallelism_the_first_stage_holds_the_last_stages_figures(tmp_path):
    """PP=2 x DP=2: only the second stage computes a loss. Rank 0 (a loading rank of the first stage) prints what
    the broadcast over the pipeline group gave it, at every logged iteration; that is, to the printed digits, what
    the last rank wrote to TensorBoard, whose token-weighted means are Megatron's lm loss."""
    h, r, ev = megatron_run(tmp_path, "mg-pp", pp=2)
    assert_weighted_means_are_lm_loss(h, ev)
    received = re.findall(r"zephon: loss by source (.*) \| iteration (\d+) \| received from the last pipeline stage",
                          r.text)
    assert [int(it) for _, it in received] == [1, 2, 3, 4]
    written = re.findall(r"zephon: loss by source (.*) \| iteration (\d+)$", r.text, re.MULTILINE)
    assert sorted(written, key=lambda w: int(w[1])) == received, "both ends of the broadcast print the same figures"
    for line, it in received:
        shown = dict(pair.split("=") for pair in line.split())
        for n in MG_NAMES:
            want = ev.get(f"zephon/loss/{n}", {}).get(int(it))
            if want is None:
                assert shown[n] == "-", (it, n, shown)
            else:  # TensorBoard keeps float32: equal to the printed digits, not to their rounding
                assert float(shown[n]) == pytest.approx(want, abs=1e-5), (it, n, shown)
