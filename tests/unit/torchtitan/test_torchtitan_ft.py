"""zephon_torchtitan.ft without torchrun or torchft's lighthouse: the rules, the pads and weights, the step log, and
the loader's checkpoint slot in live mode (the run itself: tests/e2e/test_torchtitan_ft_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan.experiments.torchft")

from torchtitan.components.loss import CrossEntropyLoss  # noqa: E402
from torchtitan.components.tokenizer import HuggingFaceTokenizer  # noqa: E402

from zephon_core.integration import IntegrationError, load_recipe  # noqa: E402
from zephon_core.live import LiveLanes  # noqa: E402
from zephon_torchtitan import ft  # noqa: E402
from zephon_torchtitan.config_registry import llama3_debugmodel_zephon_ft  # noqa: E402
from zephon_torchtitan.core import IGNORE_INDEX, decode_state  # noqa: E402
from zephon_torchtitan.tt03 import ZephonDataLoader  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "configs" / "data" / "tt_train.toml"


@pytest.fixture(scope="module")
def tok():
    return HuggingFaceTokenizer(tokenizer_path=str(ROOT / "configs" / "corpus"))


def test_the_recipe_runs_in_live_mode_as_is():
    cfg = llama3_debugmodel_zephon_ft()
    assert isinstance(cfg, ft.ZephonFTTrainer.Config)
    assert isinstance(cfg.fault_tolerance, ft.ZephonFTManager.Config) and cfg.fault_tolerance.enable
    assert cfg.fault_tolerance.init_sync is False and cfg.fault_tolerance.semi_sync_method is None
    assert isinstance(cfg.optimizer, ft.ZephonFTOptimizers.Config)
    assert cfg.checkpoint.enable and cfg.checkpoint.enable_ft_dataloader_checkpoints is False
    assert ft.live_config_problems(cfg) == []


@pytest.mark.parametrize("change,needle", [
    (lambda c: setattr(c.fault_tolerance, "enable", False), "--fault_tolerance.enable"),
    (lambda c: setattr(c.fault_tolerance, "semi_sync_method", "diloco"), "semi_sync_method='diloco'"),
    (lambda c: setattr(c.checkpoint, "enable", False), "set --checkpoint.enable"),
    (lambda c: setattr(c.checkpoint, "enable_ft_dataloader_checkpoints", True),
     "enable_ft_dataloader_checkpoints false"),
    (lambda c: setattr(c.debug, "seed", None), "set --debug.seed"),
    (lambda c: setattr(c.parallelism, "pipeline_parallel_degree", 2), "pipeline_parallel_degree 1"),
    (lambda c: setattr(c.dataloader, "infinite", False), "needs the Zephon training loader"),
])
def test_each_broken_rule_is_one_line_naming_the_setting(change, needle):
    cfg = llama3_debugmodel_zephon_ft()
    change(cfg)
    problems = ft.live_config_problems(cfg)
    assert len(problems) == 1 and needle in problems[0], problems


def test_init_sync_true_is_left_to_torchfts_rule_and_needs_no_seed():
    cfg = llama3_debugmodel_zephon_ft()
    cfg.fault_tolerance.init_sync, cfg.debug.seed = True, None
    assert ft.live_config_problems(cfg) == []  # LiveData refuses async quorum with init_sync=True at start-up


def test_the_data_identity_is_the_rank_inside_the_replica_group():
    manager = ft.ZephonFTManager(ft.ZephonFTManager.Config(enable=False, replica_id=3, group_size=4))
    assert manager.get_dp_info(2, 1) == (2, 1)


def test_batches_per_lane():
    assert ft.batches_per_lane(8, 4) == 2
    with pytest.raises(IntegrationError, match="batches per optimizer step"):
        ft.batches_per_lane(None, 4)


def test_a_pad_has_no_valid_label_and_zero_loss_even_alone():
    inputs, labels = ft.pad_batch(2, 16)
    assert inputs["input"].shape == inputs["positions"].shape == labels.shape == (2, 16)
    assert bool((labels == IGNORE_INDEX).all())
    tokens = (labels != IGNORE_INDEX).sum()  # 0: a replica group running pads only
    pred = torch.randn(2, 16, 32, requires_grad=True)
    loss, _ = CrossEntropyLoss(CrossEntropyLoss.Config())(pred, labels, ft.weighted_tokens(tokens, 0.0))
    loss.backward()
    assert float(loss.detach()) == 0.0 and bool((pred.grad == 0).all())


def test_the_weight_scales_the_summed_loss():
    tokens = torch.tensor(40)
    assert ft.weighted_tokens(tokens, 1.0) is tokens  # the common case is TorchTitan's own arithmetic
    assert float(ft.weighted_tokens(tokens, 2.0)) == 20.0
    assert int(ft.weighted_tokens(torch.tensor(0), 0.0)) == 1


def test_the_feed_never_ends_the_data():
    feed = ft._Feed()
    feed.queue.append(ft.pad_batch(1, 4))
    next(feed)
    with pytest.raises(IntegrationError, match="more micro-batches than this step has"):
        next(feed)


def _loader(tok, dp=1, rank=0):
    return ZephonDataLoader(ZephonDataLoader.Config(recipe=str(RECIPE), global_batch_size=8), dp_world_size=dp,
                            dp_rank=rank, tokenizer=tok, seq_len=128, local_batch_size=2)


def test_the_step_log_round_trips(tmp_path, tok):
    loader = _loader(tok)
    live = LiveLanes(loader.pipeline, 1)
    attempt = live.begin(2, 1)
    path = tmp_path / "b.log.steps"
    path.write_text(ft.step_line(0, attempt, False, 7) + ft.step_line(0, live.begin(1, None), True, 8))
    first, second = ft.read_step_log(path)
    assert first == ft.StepRecord(0, False, 2, 1, (2, 3), 7)
    assert second == ft.StepRecord(0, True, 1, None, (), 8)
    live.close()


def test_in_live_mode_the_checkpoint_slot_holds_the_committed_lanes(tok):
    """The loader's state is the live lanes' committed table (a discarded attempt leaves it), and it restores
    offline on another data-parallel degree; the loader itself is not iterated in live mode."""
    loader = _loader(tok)
    live = LiveLanes(loader.pipeline, 1)
    loader._stream.live = live
    with pytest.raises(IntegrationError, match="live mode"):
        next(iter(loader))
    first = live.begin(1, 0)
    summed = live.exchange()
    live.settle(summed, 1, committed=False)  # discarded: nothing consumed
    assert _delivered(loader) == {0}
    again = live.begin(1, 0)
    assert [b.digest for b in again.batches] == [b.digest for b in first.batches]
    live.settle(live.exchange(), 1, committed=True)
    assert _delivered(loader) == {1}
    nxt = live.begin(1, 0).batches
    got = []
    for rank in (0, 1):
        other = _loader(tok, dp=2, rank=rank)
        other.load_state_dict({"zephon_state": loader.state_dict()["zephon_state"]})
        it = iter(other)
        got += [next(it) for _ in range(2)]
        other.pipeline.close()
    want = {tuple(map(tuple, b.input_ids.tolist())) for b in nxt}
    assert {tuple(map(tuple, x["input"].tolist())) for x, _ in got} == want
    live.close()


def _delivered(loader) -> set[int]:
    return {int(v["delivered"]) for v in decode_state(loader.state_dict()["zephon_state"])["lanes"].values()}


def test_a_spare_runs_as_many_micro_batches_as_the_active_replicas(tok):
    live, other = LiveLanes(_loader(tok).pipeline, 1), LiveLanes(_loader(tok).pipeline, 1)
    active, spare = live.begin(3, 0), other.begin(3, 2)
    assert active.plan.microbatches == spare.plan.microbatches == 2  # L=4, P=3 -> A=2
    assert [w for _, w in active.microbatches()] == [0.75, 0.75]  # P / (k x L): each micro-batch's own mean loss
    # TorchTitan's loss is already divided by the step's valid tokens: the step's weight P / A, pads 0.
    assert ft.loss_weights(active) == [1.5, 1.5] and ft.loss_weights(spare) == [0.0, 0.0]
    assert [(b, w) for b, w in spare.microbatches()] == [(None, 0.0), (None, 0.0)]
    assert spare.plan.loss_scale == 0.0
    live.close()
    other.close()


def test_a_replica_groups_loader_checkpoints_under_its_own_run_id_loading_the_recipe_once(tok, monkeypatch):
    from zephon_core.integration import coordination

    cfg = llama3_debugmodel_zephon_ft()
    cfg.fault_tolerance.replica_id = 2
    ft._name_replica_group(cfg)
    assert cfg.dataloader.replica_group == 2 and cfg.dataloader.run_id == ""  # the setting itself is left alone
    loads = []
    monkeypatch.setattr(coordination, "load_recipe", lambda *a, **k: loads.append(a) or load_recipe(*a, **k))
    cfg.dataloader.recipe, cfg.dataloader.run_id, cfg.dataloader.global_batch_size = str(RECIPE), "run", 8
    loader = ZephonDataLoader(cfg.dataloader, dp_world_size=1, dp_rank=0, tokenizer=tok, seq_len=128,
                              local_batch_size=2)
    assert loader._stream.plan.coordination.run_id == "run-replica2" and len(loads) == 1
    loader.pipeline.close()
