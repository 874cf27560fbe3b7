"""Megatron's steered mixture (``--zephon-mixing``): the settings it refuses, on every rank alike, and a logged
iteration's figures steering a real ``MixingLoader`` over token arrays (one process: nothing to reduce). The
launches, DP=2 resumed at DP=1, are tests/e2e/test_megatron_mixing_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from torchtitan_cpu.runs import token_corpora  # noqa: E402

from zephon_core.integration import source_loss_of  # noqa: E402
from zephon_core.pipeline.mixing import MixingLoader  # noqa: E402
from zephon_core.recipe import load_recipe  # noqa: E402
from zephon_megatron.args import Settings  # noqa: E402
from zephon_megatron.steering import mixing_of, steer  # noqa: E402
from zephon_megatron.validate import ZephonMegatronError  # noqa: E402

NAMES = ("examples", "prose", "reference")


def _recipe(folder: Path, mixing: bool = True) -> Path:
    token_corpora(folder)
    (folder / "mix.toml").write_text("[[decisions]]\nstep = 2\nweights = { examples = 1, prose = 1, reference = 8 }\n")
    text = "seed = 11\nchunk_size = 4\ncanonical_replicas = 2\n\n" + "".join(
        f'[[sources]]\nname = "{n}"\npath = "{n}.npy"\nformat = "token_array"\noffsets = "{n}_offsets.npy"\n\n'
        for n in NAMES)
    if mixing:
        text += '[mixing]\ncontroller = "schedule"\nschedule = "mix.toml"\ninterval_steps = 2\n'
    (folder / "r.toml").write_text(text)
    return folder / "r.toml"


def test_mixing_needs_the_per_source_loss_and_a_mixing_table(tmp_path):
    recipe = _recipe(tmp_path)
    with pytest.raises(ZephonMegatronError, match="add --zephon-source-loss"):
        mixing_of(Settings(str(recipe), mixing=True), load_recipe(recipe))
    (tmp_path / "bare").mkdir()
    bare = _recipe(tmp_path / "bare", mixing=False)
    with pytest.raises(ZephonMegatronError, match="has no \\[mixing\\] table; add one"):
        mixing_of(Settings(str(bare), mixing=True, source_loss=True), load_recipe(bare))
    assert mixing_of(Settings(str(recipe), source_loss=True), load_recipe(recipe)) is None, "off unless asked"
    assert mixing_of(Settings(str(recipe), mixing=True, source_loss=True), load_recipe(recipe)) is not None


def _loader(recipe, dp: int, rank: int) -> MixingLoader:
    pipeline = recipe.build(seq_len=16, batch_size=2, canonical_replicas=2, dp_degree=dp, dp_group_id=rank, prefetch=0)
    return MixingLoader(pipeline, mixing_of(Settings("r.toml", mixing=True, source_loss=True), recipe))


def test_a_logged_iteration_steers_and_the_checkpoint_holds_the_journal(tmp_path, capsys):
    recipe = load_recipe(_recipe(tmp_path))
    loader, resumed = _loader(recipe, 1, 0), _loader(recipe, 2, 1)
    try:
        it = iter(loader)
        for step in (1, 2):
            for _ in range(2):  # a step: one micro-batch per lane
                next(it)
            decision = steer(loader, source_loss_of(step, NAMES, [[3.0, 2.0, 1.0], [10, 10, 10]]))
            assert (decision is None) == (step == 1)
        assert decision is not None and decision.weights == {"examples": 1000, "prose": 1000, "reference": 8000}
        assert decision.figures["loss_tokens"] == {n: 20 for n in NAMES}, "both iterations' figures"
        assert "zephon: mixing decision 1 after iteration 2: from global chunk" in capsys.readouterr().out
        resumed.restore(loader.checkpoint())
        assert resumed.journal == loader.journal, "a resume at another degree replays the journal"
    finally:
        loader.close()
        resumed.close()


def _args(**kw):
    """Megatron's parsed arguments of a steered run that saves (megatron-core 0.19's defaults otherwise)."""
    from argparse import Namespace

    base = dict(data_parallel_size=2, micro_batch_size=2, global_batch_size=8, save="ckpt", dataloader_save="dl",
                zephon_mixing=True, log_interval=10, save_interval=20, non_persistent_save_interval=None,
                exit_interval=None, train_iters=100, train_samples=None, phase_transition_iterations=None,
                create_attention_mask_in_dataloader=False)
    return Namespace(**{**base, **kw})


def _refusals(args, batch_steps=()):
    from zephon_megatron.validate import RunShape, problems

    return [p for p in problems(RunShape.from_args(args, canonical_replicas=2, batch_steps=batch_steps))
            if "does not log" in p]


def test_a_steered_run_whose_checkpoint_falls_on_an_iteration_it_does_not_log_is_refused_in_one_line():
    from zephon_megatron.validate import RunShape, check

    assert _refusals(_args()) == []
    with pytest.raises(ZephonMegatronError, match=r"^zephon: --save-interval = 25 saves a checkpoint at iteration 25, "
                                                  r"which --log-interval = 10 does not log: .*; set --save-interval to "
                                                  r"a multiple of --log-interval \(e.g. 30\)$"):
        check(RunShape.from_args(_args(save_interval=25), canonical_replicas=2))
    (end,) = _refusals(_args(train_iters=95))
    assert end.startswith("--train-iters = 95, at the end of training, saves a checkpoint at iteration 95")
    assert end.endswith("set --train-iters so that training ends at a multiple of --log-interval "
                        "(e.g. 100 iterations)")
    (samples,) = _refusals(_args(train_iters=95, train_samples=760))
    assert samples.startswith("--train-samples = 760 (95 iterations), at the end of training, saves")
    for flag, kw in (("--non-persistent-save-interval = 5", dict(non_persistent_save_interval=5)),
                     ("--exit-interval = 15", dict(exit_interval=15)),
                     ("--phase-transition-iterations 45", dict(phase_transition_iterations=[40, 45]))):
        (line,) = _refusals(_args(**kw))
        assert line.startswith(flag), line
    # A batch-size schedule saves before the step whose global batch grows: after iterations 5 and 30 here.
    (ramp,) = _refusals(_args(rampup_batch_size=["4", "4", "16"]), batch_steps=((1, 5, 4), (6, 30, 8), (31, 100, 16)))
    assert ramp.startswith("--rampup-batch-size, whose global batch changes after it, saves a checkpoint at "
                           "iteration 5,")
    assert ramp.endswith("set --log-interval to a divisor of every such iteration (e.g. 5)")
    assert _refusals(_args(log_interval=5), batch_steps=((1, 5, 4), (6, 30, 8), (31, 100, 16))) == []
    for off in (_args(save_interval=25, zephon_mixing=False), _args(save_interval=25, save=None, dataloader_save=None)):
        assert _refusals(off) == [], "nothing steered, or no checkpoint: nothing to lose"
