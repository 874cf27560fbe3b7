"""A steered mixture in TorchTitan 0.3's loader (``mixing``): the real loader over a recipe with ``[mixing]``,
steered by ``steering.steer`` as the metrics processor does at a logged step, checkpointed through its DCP slot
and resumed on another data-parallel degree; and the settings it refuses. The torchrun launches are
tests/e2e/test_mixing_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from torchtitan.components.tokenizer import HuggingFaceTokenizer  # noqa: E402
from torchtitan_cpu.runs import mixed_recipe  # noqa: E402

import zephon_torchtitan as zt  # noqa: E402
from zephon_core.curriculum.definition import parse_definition  # noqa: E402
from zephon_core.integration import IntegrationError, SourceLoss  # noqa: E402
from zephon_torchtitan.core import decode_state  # noqa: E402
from zephon_torchtitan.steering import steer  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
NAMES = ("examples", "reference", "prose")


@pytest.fixture(scope="module")
def tok():
    return HuggingFaceTokenizer(tokenizer_path=str(ROOT / "configs" / "corpus"))


def steered_recipe(folder: Path) -> Path:
    recipe = mixed_recipe(folder)
    (folder / "mix.toml").write_text("[[decisions]]\nstep = 2\nweights = { examples = 1, reference = 1, prose = 8 }\n")
    recipe.write_text(recipe.read_text() + '\n[mixing]\ncontroller = "schedule"\nschedule = "mix.toml"\n'
                      "interval_steps = 2\n")
    return recipe


def _loader(tok, recipe, dp=1, **cfg):
    return zt.ZephonDataLoader.Config(recipe=str(recipe), global_batch_size=8, **cfg).build(
        dp_world_size=dp, dp_rank=0, tokenizer=tok, seq_len=64, local_batch_size=2)


def _figures(step):
    return SourceLoss(step, NAMES, (3.0, 2.0, 1.0), (10, 10, 10))


def test_a_logged_step_steers_the_loader_and_its_checkpoint_resumes_on_another_degree(tok, tmp_path):
    recipe = steered_recipe(tmp_path)
    loader = _loader(tok, recipe, source_loss=True, mixing=True)
    stream = loader._stream
    it = iter(loader)
    for step in (1, 2):
        for _ in range(4):  # a step's batches: 8 rows of 2
            next(it)
        decision = steer(stream.mixing, _figures(step), None)
        assert (decision is None) == (step == 1)
    assert decision.weights == {"examples": 1000, "reference": 1000, "prose": 8000}
    assert stream.pipeline is stream.mixing.pipeline and stream.pipeline.work_source.journal.decisions == (decision,)
    state = loader.state_dict()
    assert parse_definition(decode_state(state["zephon_state"])["definition"]).journal.decisions == (decision,)
    after = [next(it)[1].tolist() for _ in range(12)]

    # dp=2's first group resumes: the journal is replayed (nothing decided again) and its batches are the run's.
    resumed = _loader(tok, recipe, dp=2, source_loss=True, mixing=True)
    resumed.load_state_dict(state)
    assert resumed._stream.mixing.journal.decisions == (decision,)
    assert next(iter(resumed))[1].tolist() in after


def test_mixing_is_refused_without_a_mixing_table_without_source_loss_or_in_live_mode(tok, tmp_path):
    with pytest.raises(IntegrationError, match=r"has no \[mixing\] table; add one"):
        _loader(tok, mixed_recipe(tmp_path), source_loss=True, mixing=True)
    with pytest.raises(IntegrationError, match="turn source_loss on too"):
        _loader(tok, steered_recipe(tmp_path), mixing=True)
    with pytest.raises(IntegrationError, match=r"^zephon: steering \(mixing\) is refused in live mode \(torchft\)"):
        _loader(tok, steered_recipe(tmp_path), source_loss=True, mixing=True, replica_group=0)
    assert _loader(tok, steered_recipe(tmp_path))._stream.mixing is None, "the table alone steers nothing"


def test_a_recipes_skip_holds_across_a_decision(tok, tmp_path):
    """``[surgery]`` with ``[mixing]``: the skip is journaled into the pipeline the run delivers from, and the
    pipeline a decision rebuilds keeps it (``Pipeline.switched`` carries the journal): after step 2's decision, the
    run that skips step 3 delivers what the run without the skip delivers as step 4."""
    recipe = steered_recipe(tmp_path)
    skipping = tmp_path / "skipping.toml"
    skipping.write_text(recipe.read_text() + '\n[surgery]\nskip_steps = ["3..3"]\n')
    after = []
    for r in (recipe, skipping):
        loader = _loader(tok, r, source_loss=True, mixing=True)
        loader._stream.skips_refused = None  # as ZephonTrainer sets it
        it = iter(loader)
        for step in (1, 2):
            for _ in range(4):
                next(it)
            steer(loader._stream.mixing, _figures(step), None)
        after.append([next(it)[1].tolist() for _ in range(8 if r == recipe else 4)])
        assert len(loader._stream.mixing.journal.decisions) == 1
    assert after[1] == after[0][4:]


def _job(interval=10, log_freq=1, steps=10, model_only=False, enable=True, mixing=True):
    """``llama3_debugmodel_zephon``'s config dict as TorchTitan hands it to the metrics processor."""
    from dataclasses import replace

    from zephon_torchtitan.config_registry import llama3_debugmodel_zephon

    cfg = llama3_debugmodel_zephon()
    cfg.dataloader.mixing = cfg.dataloader.source_loss = mixing
    cfg.checkpoint = replace(cfg.checkpoint, enable=enable, interval=interval, last_save_model_only=model_only)
    cfg.metrics = replace(cfg.metrics, log_freq=log_freq)
    cfg.training = replace(cfg.training, steps=steps)
    return cfg


def test_a_steered_job_whose_checkpoint_falls_on_a_step_it_does_not_log_is_refused_in_one_line():
    from zephon_core.integration import unlogged_saves
    from zephon_torchtitan.metrics import save_clock
    from zephon_torchtitan.tt03 import ZephonMetricsProcessor

    cfg = _job(interval=15, log_freq=10, steps=40)
    with pytest.raises(IntegrationError, match=r"^zephon: checkpoint.interval = 15 saves a checkpoint at step 15, "
                                              r"which metrics.log_freq = 10 does not log: .*; set checkpoint.interval "
                                              r"to a multiple of metrics.log_freq \(e.g. 20\)$"):
        ZephonMetricsProcessor(cfg.metrics, parallel_dims=None, config_dict=cfg.to_dict())
    (last,) = unlogged_saves(save_clock(_job(interval=10, log_freq=10, steps=25).to_dict()))
    assert last.startswith("training.steps = 25 (the last step, checkpoint.last_save_model_only = false) saves a "
                           "checkpoint at step 25")
    assert last.endswith("set training.steps to a multiple of metrics.log_freq (e.g. 30), or "
                         "checkpoint.last_save_model_only = true")
    # Step 1 is logged (TorchTitan logs it whatever log_freq): a one-step run's last checkpoint is exact.
    for fine in (_job(interval=20, log_freq=10, steps=40), _job(interval=10, log_freq=10, steps=25, model_only=True),
                 _job(interval=10, log_freq=10, steps=1), _job(interval=15, log_freq=10, steps=14, model_only=True)):
        assert unlogged_saves(save_clock(fine.to_dict())) == []
    for off in (_job(interval=15, log_freq=10, enable=False), _job(interval=15, log_freq=10, mixing=False)):
        assert save_clock(off.to_dict()) is None, "no checkpoint, or nothing steered: nothing to lose"
