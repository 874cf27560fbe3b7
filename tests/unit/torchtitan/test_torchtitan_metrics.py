"""Zephon's figures in TorchTitan's own metrics: ``zephon_metrics`` (0.3) and ``[zephon] log_metrics`` (0.2).

TorchTitan 0.3's real MetricsProcessor and TensorBoard logger write the event file here; only
its CUDA memory monitor and peak-FLOPS lookup are stood in for (this machine has no GPU).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")
pytest.importorskip("tensorboard")

import torchtitan.components.metrics as ttm  # noqa: E402
import torchtitan.tools.utils as ttu  # noqa: E402
from support.tensorboard_events import scalars  # noqa: E402
from torchtitan.components.metrics import MetricsProcessor  # noqa: E402
from torchtitan.components.tokenizer import HuggingFaceTokenizer  # noqa: E402
from tt022 import run_022  # noqa: E402

import zephon_torchtitan as zt  # noqa: E402
import zephon_torchtitan.core as core  # noqa: E402
import zephon_torchtitan.metrics as ztm  # noqa: E402
from zephon_core import Pipeline  # noqa: E402
from zephon_core.integration.batch_log import read_batch_log  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "configs" / "data" / "tt_train.toml"
TOKENIZER = ROOT / "configs" / "corpus"


class Memory:
    """Stands in for TorchTitan's CUDA memory monitor."""

    device_name = "cpu"

    def get_peak_stats(self):
        return ttm.DeviceMemStats(0.0, 0.0, 0.0, 0.0, 0, 0)

    def reset_peak_stats(self):
        pass


@pytest.fixture
def processor(tmp_path, monkeypatch):
    """``metrics`` config -> a built processor that logs to TensorBoard under tmp_path."""
    monkeypatch.setattr(ttm, "build_device_memory_monitor", lambda: Memory())
    monkeypatch.setattr(ttu, "get_peak_flops", lambda name: 1e12)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)  # the metrics rank

    def build(cfg):
        dims = SimpleNamespace(pp_enabled=False, non_data_parallel_size=1)
        p = cfg.build(parallel_dims=dims, dump_folder=str(tmp_path))
        p.num_flops_per_token = 1
        return p

    return build


def _log_step(p, step):
    p.data_loading_times.append(0.01)
    p.log(step, 2.0, 2.0, 1.0, extra_metrics={"n_tokens_seen": 10})


def _loader(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_BATCH_LOG", str(tmp_path / "batches-{rank}.log"))
    tok = HuggingFaceTokenizer(tokenizer_path=str(TOKENIZER))
    loader = zt.ZephonDataLoader.Config(recipe=str(RECIPE), global_batch_size=8).build(
        dp_world_size=2, dp_rank=0, tokenizer=tok, seq_len=64, local_batch_size=2)
    return loader, iter(loader)


def test_logged_steps_carry_zephon_figures_in_the_event_file(tmp_path, monkeypatch, processor):
    p = processor(zt.zephon_metrics(MetricsProcessor.Config(enable_tensorboard=True, log_freq=1)))
    loader, it = _loader(tmp_path, monkeypatch)
    for step, batches in ((1, 3), (2, 2), (3, 1)):
        for _ in range(batches):
            next(it)
        _log_step(p, step)
        if step == 2:
            loader.state_dict()  # a checkpoint: the run-wide figures follow it
    p.close()
    ev = scalars(tmp_path / "tb")
    assert ev["loss_metrics/global_avg_loss"] == {1: 2.0, 2: 2.0, 3: 2.0}, "TorchTitan's own metrics are unchanged"
    (source,) = [s.name for s in loader.pipeline.stats().sources]
    logged = list(read_batch_log(tmp_path / "batches-0.log"))
    delivered = [sum((Counter(b.tokens) for b in logged[:n]), Counter())[0] for n in (3, 5, 6)]
    assert ev[f"zephon/tokens/{source}"] == dict(zip((1, 2, 3), delivered))
    assert ev["zephon/batches"] == {1: 3.0, 2: 5.0, 3: 6.0}
    assert ev[f"zephon/run/tokens/{source}"] == {3: delivered[1]}  # as of the checkpoint after step 2
    assert 0.0 <= ev["zephon/interval/wait_fraction"][2] <= 1.0 and ev["zephon/interval/seconds"][2] > 0


def test_without_the_override_nothing_of_zephon_is_taken(tmp_path, monkeypatch, processor):
    p = processor(MetricsProcessor.Config(enable_tensorboard=True, log_freq=1))
    assert type(p) is MetricsProcessor
    _, it = _loader(tmp_path, monkeypatch)
    next(it)
    monkeypatch.setattr(Pipeline, "stats", lambda self: pytest.fail("stats() called with the metrics off"))
    _log_step(p, 1)

    class Recorder:
        def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
            self.extra = extra_metrics

    class Off(ztm.MetricsLogging, Recorder):
        pass

    off = Off()
    off.log(1, 2.0, 2.0, 1.0, extra_metrics={"n_tokens_seen": 1})
    assert off.extra == {"n_tokens_seen": 1}


def test_without_a_zephon_training_loader_torchtitans_metrics_are_logged_and_it_warns_once(
        tmp_path, monkeypatch, processor, caplog):
    monkeypatch.setattr(core, "_TRAINING_STREAM", {})
    p = processor(zt.zephon_metrics(MetricsProcessor.Config(enable_tensorboard=True, log_freq=1)))
    with caplog.at_level("WARNING", logger="zephon_torchtitan"):
        _log_step(p, 1)
        _log_step(p, 2)
    p.close()
    warned = ("zephon: Zephon's metrics are on, but this process built no Zephon training loader; "
              "nothing of Zephon's is logged")
    assert [r.getMessage() for r in caplog.records].count(warned) == 1
    ev = scalars(tmp_path / "tb")
    assert "loss_metrics/global_avg_loss" in ev and not any(tag.startswith("zephon/") for tag in ev)


def test_the_override_keeps_the_metrics_settings_and_refuses_a_processor_of_the_jobs_own():
    cfg = zt.zephon_metrics(MetricsProcessor.Config(log_freq=7, enable_tensorboard=True, save_tb_folder="x"))
    assert type(cfg) is zt.ZephonMetricsProcessor.Config and cfg._owner is zt.ZephonMetricsProcessor
    assert (cfg.log_freq, cfg.enable_tensorboard, cfg.save_tb_folder) == (7, True, "x")
    assert zt.zephon_metrics(cfg) is cfg

    class Own(MetricsProcessor):
        from dataclasses import dataclass

        @dataclass(kw_only=True, slots=True)
        class Config(MetricsProcessor.Config):
            pass

    refused = "this job's metrics processor is .*Own.Config; mix zephon_torchtitan.metrics.MetricsLogging"
    with pytest.raises(ValueError, match=refused):
        zt.zephon_metrics(Own.Config())


def test_torchtitan_02_train_specs_build_the_metrics_processor_and_check_log_metrics():
    code = """
import types, zephon_torchtitan.tt02 as t
from torchtitan.protocols.train_spec import get_train_spec
from zephon_torchtitan.metrics import MetricsLogging
spec = get_train_spec("llama3_zephon")
assert spec.build_metrics_processor_fn is t.build_zephon_metrics_processor
assert t.ZephonMetricsProcessor022.__mro__[1] is MetricsLogging
for value, ok in ((True, True), (False, True), (1, False), ("true", False)):
    job = types.SimpleNamespace(zephon=t.ZephonSection(recipe="r.toml", log_metrics=value))
    try:
        t.settings_from(job)
    except ValueError as e:
        assert not ok and "[zephon] log_metrics must be bool" in str(e), e
    else:
        assert ok, value
print("ok")
"""
    run_022(code)
