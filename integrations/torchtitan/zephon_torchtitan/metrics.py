"""Zephon's figures in TorchTitan's metrics, for both generations: ``zephon/...`` beside its own.

Never imports torchtitan: ``tt03.ZephonMetricsProcessor`` (0.3, the
``zephon_torchtitan.zephon_metrics`` override) and ``tt02.ZephonMetricsProcessor022`` (0.2,
``[zephon] log_metrics``) mix ``MetricsLogging`` into TorchTitan's own ``MetricsProcessor``.
TorchTitan hands the processor no loader, so the figures are those of the training loader
this process built (``core.training_stream``).

With the loader's ``source_loss`` on, every ``log()`` also reduces the per-source training loss
since the previous logged step (``source_loss.SourceLossTally.reduce``: a collective, and TorchTitan
calls ``log()`` on every rank), logs ``zephon/loss/<source>`` (the mean loss per counted token of
each source over those steps) and hands the figures to ``zephon_core.integration.publish_source_loss``;
with the loader's ``mixing`` on, to the mixture's controller too (``steering.steer``). So a steered run
checkpoints only at logged steps (``save_clock``: refused at start-up otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zephon_core.integration import (
    IntervalMetrics,
    LoggedFigures,
    SaveClock,
    SourceLoss,
    next_multiple,
    publish_source_loss,
)
from zephon_torchtitan.core import LOG, training_stream
from zephon_torchtitan.steering import steer


def save_clock(config: Mapping[str, Any]) -> SaveClock | None:
    """When a steered job (its loader's ``mixing``) logs and checkpoints, from TorchTitan 0.3's job config as a dict
    (what it hands the metrics processor); None when it steers nothing or saves no checkpoint.

    TorchTitan logs step 1 and every multiple of ``metrics.log_freq`` (``MetricsProcessor.should_log``) and saves
    after a step's log: at every multiple of ``checkpoint.interval``, at step 1 with ``enable_first_step_checkpoint``
    (logged) and at the last step, ``training.steps``, whose checkpoint holds the loader's state only with
    ``checkpoint.last_save_model_only`` off.
    """
    loader, ckpt = config.get("dataloader") or {}, config.get("checkpoint") or {}
    if not loader.get("mixing") or not ckpt.get("enable") or ckpt.get("load_only"):
        return None
    log_freq, steps = int((config.get("metrics") or {}).get("log_freq", 10)), int(config["training"]["steps"])
    at = () if ckpt.get("last_save_model_only", True) else (
        (f"training.steps = {steps} (the last step, checkpoint.last_save_model_only = false)", steps,
         f"set training.steps to a multiple of metrics.log_freq (e.g. {next_multiple(steps, log_freq)}), "
         "or checkpoint.last_save_model_only = true"),)
    return SaveClock("metrics.log_freq", log_freq, every=(("checkpoint.interval", int(ckpt.get("interval", 500))),),
                     at=at, last=steps, first_logged=True)


class TrainingMetrics:
    """One logging interval's Zephon figures of this process's training loader (``IntervalMetrics``)."""

    def __init__(self, prefix: str = "zephon/") -> None:
        self._interval = IntervalMetrics(prefix)
        self._warned = False

    def take(self) -> LoggedFigures | None:
        stream = training_stream()
        if stream is None:
            if not self._warned:
                self._warned = True
                LOG.warning("zephon: Zephon's metrics are on, but this process built no Zephon training loader; "
                            "nothing of Zephon's is logged")
            return None
        return self._interval.take(stream.pipeline.stats())

    def source_loss(self, step: int, parallel_dims: Any) -> SourceLoss | None:
        """The per-source loss since the previous logged step, reduced and published; None when it is off."""
        stream = training_stream()
        if stream is None or stream.source_loss is None:
            return None
        figures = stream.source_loss.reduce(step, parallel_dims)
        publish_source_loss(figures)
        if stream.mixing is not None:
            steer(stream.mixing, figures, parallel_dims)
        return figures


class MetricsLogging:
    """Mixed in before TorchTitan's ``MetricsProcessor``: every ``log()`` adds Zephon's figures to the step's.

    They go into ``extra_metrics``, so the processor's own loggers (TensorBoard, W&B)
    write them at the logged step, on the ranks TorchTitan writes from; Zephon's
    console line follows TorchTitan's, on every rank as TorchTitan's does. With
    ``zephon`` None nothing is added and no snapshot is taken.
    """

    zephon: TrainingMetrics | None = None

    def log(self, step: int, global_avg_loss: float, global_max_loss: float, grad_norm: float,
            extra_metrics: dict[str, Any] | None = None) -> None:
        figures = by_source = None
        if self.zephon is not None:
            figures = self.zephon.take()
            by_source = self.zephon.source_loss(step, getattr(self, "parallel_dims", None))
        if figures is not None:
            extra_metrics = {**(extra_metrics or {}), **figures.scalars}
        if by_source is not None:
            extra_metrics = {**(extra_metrics or {}), **by_source.scalars()}
        super().log(  # type: ignore[misc]
            step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra_metrics)
        if figures is not None:
            LOG.info(figures.line)
        if by_source is not None:
            LOG.info(by_source.line())
