"""TorchTitan 0.3.x: the loader class and its Config, the Trainer that tells it the batch sizes, and
the metrics processor that also logs Zephon's figures.

TorchTitan 0.3.0 builds a loader with ``dp_world_size, dp_rank, tokenizer,
seq_len, local_batch_size, snapshot_every_n_steps`` only: not with the global
batch size that the step-size rule needs. Two explicit ways give it to the
loader (tested against torchtitan 0.3.0):

* ``ZephonTrainer`` (used by this package's recipes, ``--module zephon_torchtitan``)
  copies ``training.global_batch_size`` and ``training.local_batch_size`` into
  every Zephon loader config of the job before TorchTitan builds anything, so
  they are the values after every CLI flag;
* with ``--override.imports`` on any other recipe, pass ``"global_batch_size": N``
  (the value of ``--training.global_batch_size``) among the override's kwargs.

A loader that learns neither warns on rank 0 that the rule is not checked.

``ZephonMetricsProcessor`` (``--override.imports zephon_torchtitan.zephon_metrics``) is
TorchTitan's ``MetricsProcessor`` whose ``log()`` adds Zephon's figures to every logged
step. TorchTitan builds it before the loader and hands neither the other, so it reads
the training loader this process built (``zephon_torchtitan.metrics``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.loss import BaseLoss, ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.config.override import derive
from torchtitan.trainer import Trainer

from zephon_core.integration import IntegrationError, Skip, refuse, unlogged_saves, warn_unknown_step_size
from zephon_core.integration.announce import skipped_steps_line
from zephon_core.live import live_data_problems
from zephon_torchtitan.core import (
    LOG,
    StreamLoader,
    ZephonStream,
    coordination_identity,
    launched_rank,
    training_stream,
)
from zephon_torchtitan.metrics import MetricsLogging, TrainingMetrics, save_clock
from zephon_torchtitan.settings import Settings, settings_of
from zephon_torchtitan.source_loss import SourceLossTally


def batches_per_optimizer_step(global_batch_size: int, training_local_batch_size: int, local_batch_size: int,
                               dp_world_size: int) -> int | None:
    """Batches all data-parallel ranks consume per optimizer step, or None when the trainer's sizes are unknown.

    ``local_batch_size`` is the loader's (the pipeline micro-batch size under
    pipeline parallelism); a negative ``global_batch_size`` is TorchTitan's
    default, ``training.local_batch_size x dp``.
    """
    if global_batch_size > 0:
        return global_batch_size // local_batch_size
    if global_batch_size < 0 and training_local_batch_size > 0:
        return training_local_batch_size * dp_world_size // local_batch_size
    return None


class ZephonDataLoader(StreamLoader, BaseDataLoader):
    """Zephon's deterministic, elastic loader in TorchTitan 0.3's loader slot.

    ``snapshot_every_n_steps`` (what TorchTitan passes when checkpointing is on)
    is honoured by construction: the state is exact after every batch, so a
    checkpoint at any step resumes at exactly the next batch.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(Settings, BaseDataLoader.Config):
        # The adapter's Settings (zephon_torchtitan.settings, described there), and what only TorchTitan 0.3 needs.
        global_batch_size: int = 0
        """training.global_batch_size, for the step-size rule: ZephonTrainer fills it; pass it with --override.imports."""
        training_local_batch_size: int = 0
        """training.local_batch_size (ZephonTrainer fills it): resolves a negative (default) global_batch_size."""
        infinite: bool = True
        """False for validation: one pass over a finite held-out recipe."""
        replica_group: int = -1
        """ZephonFTTrainer sets it: the torchft replica group, whose ranks checkpoint together under their own
        run_id (``<run_id>-replicaN``); -1: none."""
        source_loss: bool = False
        """Log the training loss per source (zephon/loss/<source>); needs zephon_source_loss and zephon_metrics."""
        mixing: bool = False
        """Steer the mixture by the recipe's [mixing] table at logged steps (docs/mixing.md); needs source_loss."""

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: Any,
        seq_len: int,
        local_batch_size: int,
        snapshot_every_n_steps: int | None = None,
        **kwargs: Any,
    ) -> None:
        if snapshot_every_n_steps is not None and (isinstance(snapshot_every_n_steps, bool) or not isinstance(snapshot_every_n_steps, int)
                                                   or snapshot_every_n_steps < 1):
            raise IntegrationError(f"zephon: snapshot_every_n_steps must be a positive integer or None, got {snapshot_every_n_steps!r}")
        settings = settings_of(config)
        live = config.replica_group >= 0  # ZephonFTTrainer names each replica group's loader: live mode
        if live:
            refuse(live_data_problems(mixing=config.mixing, without_torchft=WITHOUT_TORCHFT))
        validation = not config.infinite
        batches_per_step = None
        if not validation:
            batches_per_step = batches_per_optimizer_step(config.global_batch_size, config.training_local_batch_size,
                                                          local_batch_size, dp_world_size)
            if batches_per_step is None and coordination_identity()[1] == 0:
                warn_unknown_step_size("TorchTitan", "use --module zephon_torchtitan, or pass \"global_batch_size\" (the value of "
                                       "--training.global_batch_size) in the zephon_torchtitan.zephon_loader override's kwargs")
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self._stream = ZephonStream(
            settings,
            dp_world_size=dp_world_size,
            dp_rank=dp_rank,
            tokenizer=tokenizer,
            seq_len=seq_len,
            local_batch_size=local_batch_size,
            batches_per_step=batches_per_step,
            validation=validation,
            run_id_suffix=f"-replica{config.replica_group}" if config.replica_group >= 0 else "",
            source_loss=config.source_loss,
            mixing=config.mixing,
        )
        if live:
            request = self._stream.plan.recipe.surgery()
            refuse(live_data_problems(surgery=request.where if request else None, without_torchft=WITHOUT_TORCHFT))


#: How a TorchTitan job runs without torchft, for live mode's refusals of steering and surgery.
WITHOUT_TORCHFT = "a run without torchft (--module zephon_torchtitan, ZephonTrainer)"


def fill_batch_sizes(config: Trainer.Config) -> None:
    """Copy the job's final batch sizes into each Zephon loader config of ``config`` that has none."""
    for loader in (getattr(config, "dataloader", None), getattr(getattr(config, "validator", None), "dataloader", None)):
        if isinstance(loader, ZephonDataLoader.Config) and loader.infinite and loader.global_batch_size == 0:
            loader.global_batch_size = config.training.global_batch_size
            loader.training_local_batch_size = config.training.local_batch_size


class ZephonTrainer(Trainer):
    """TorchTitan's Trainer, telling Zephon loaders the job's batch sizes before it builds them, and running no
    training for a global step its loader's surgery journal skips (docs/when_a_run_goes_wrong.md).

    A skipped step still counts (``self.step`` runs on, as Megatron's ``--iterations-to-skip`` does) and is still
    checkpointed as TorchTitan checkpoints any step; it has no forward/backward, no optimizer or LR-scheduler step
    and takes no batch: the lanes move past its data themselves. Return ``ZephonTrainer.Config`` from a recipe
    function (``config_registry``) to use it; everything else is TorchTitan's.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        pass

    def __init__(self, config: Trainer.Config) -> None:
        fill_batch_sizes(config)
        loader = getattr(config, "dataloader", None)
        if isinstance(loader, ZephonDataLoader.Config) and loader.source_loss:
            config.loss = with_source_loss(config.loss)
        super().__init__(config)
        self._zephon = self.dataloader._stream if isinstance(self.dataloader, ZephonDataLoader) else None
        if self._zephon is not None:
            self._zephon.skips_refused = None  # train_step below runs no training for skipped steps
        self._zephon_skip: Skip | None = None  # the skip last announced: one line a range

    def train_step(self, data_iterator: Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]) -> None:
        skip = self._zephon.skip_at(self.step) if self._zephon is not None else None
        if skip is None:
            super().train_step(data_iterator)
            return
        if skip != self._zephon_skip and coordination_identity()[1] == 0:
            LOG.info(skipped_steps_line(self.step, skip.last))
        self._zephon_skip = skip


class ZephonMetricsProcessor(MetricsLogging, MetricsProcessor):
    """TorchTitan's ``MetricsProcessor``, logging Zephon's figures (``zephon/...``) with every logged step.

    What TorchTitan logs is unchanged; ``[metrics]`` settings (``log_freq``, TensorBoard,
    W&B, ``save_for_all_ranks``) apply to Zephon's figures as to its own. A steered job (the loader's
    ``mixing``) whose checkpoint can fall on a step it does not log is refused here (``metrics.save_clock``),
    before the loader is built: TorchTitan hands the processor the whole job config (``config_dict``).
    """

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        pass

    def __init__(self, config: MetricsProcessor.Config, **kwargs: Any) -> None:
        clock = save_clock(kwargs.get("config_dict") or {})
        refuse(unlogged_saves(clock) if clock is not None else [], rank=launched_rank())
        super().__init__(config, **kwargs)
        self.zephon = TrainingMetrics()


def _training_tally(pred: torch.Tensor) -> SourceLossTally | None:
    """The tally a training loss call adds to: None for validation (no gradient) or with ``source_loss`` off."""
    stream = training_stream()
    if stream is None or stream.source_loss is None or not (torch.is_grad_enabled() and pred.requires_grad):
        return None
    if isinstance(pred, DTensor):
        raise IntegrationError("zephon: source_loss needs the logits whole on each rank; it does not support "
                               "tensor parallelism (loss parallel) or full_dtensor; turn source_loss off")
    return stream.source_loss


class ZephonCrossEntropyLoss(CrossEntropyLoss):
    """TorchTitan's cross entropy, its value and gradient unchanged, that also adds every training call's
    per-token loss to the sources of the batch Zephon delivered (``source_loss``; ``zephon_torchtitan.source_loss``).

    Validation calls (no gradient) and a job whose Zephon loader has ``source_loss`` off add nothing.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(CrossEntropyLoss.Config):
        in_chunks: bool = False
        """Inside a ZephonChunkedLossWrapper, which starts each micro-batch; each call is a chunk of it."""

    def __init__(self, config: Config, *, compile_config: Any = None) -> None:
        super().__init__(config, compile_config=compile_config)
        self.in_chunks = config.in_chunks

    def __call__(self, pred: torch.Tensor, labels: torch.Tensor, global_valid_tokens: torch.Tensor | None = None,
                 **kwargs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out = super().__call__(pred, labels, global_valid_tokens, **kwargs)
        tally = _training_tally(pred)
        if tally is not None:
            if not self.in_chunks:
                tally.begin(labels)
            tally.add(pred, labels)
        return out


class ZephonChunkedLossWrapper(ChunkedLossWrapper):
    """TorchTitan's ``ChunkedLossWrapper``, unchanged, that starts each micro-batch's per-source tally (its inner
    ``ZephonCrossEntropyLoss`` adds each chunk)."""

    @dataclass(kw_only=True, slots=True)
    class Config(ChunkedLossWrapper.Config):
        pass

    def __call__(self, pred: torch.Tensor, labels: torch.Tensor, global_valid_tokens: torch.Tensor | None = None,
                 **loss_inputs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        tally = _training_tally(pred)
        if tally is not None:
            tally.begin(labels)
        return super().__call__(pred, labels, global_valid_tokens, **loss_inputs)


def with_source_loss(cfg: BaseLoss.Config) -> BaseLoss.Config:
    """``cfg`` with its cross entropy made ``ZephonCrossEntropyLoss`` (in a ``ZephonChunkedLossWrapper`` if chunked)."""
    if isinstance(cfg, (ZephonCrossEntropyLoss.Config, ZephonChunkedLossWrapper.Config)):
        return cfg
    if type(cfg) is ChunkedLossWrapper.Config:
        inner = with_source_loss(cfg.loss_fn)
        assert isinstance(inner, ZephonCrossEntropyLoss.Config)
        return derive(cfg, ZephonChunkedLossWrapper.Config, loss_fn=replace(inner, in_chunks=True))
    if type(cfg) is CrossEntropyLoss.Config:
        return ZephonCrossEntropyLoss.Config(global_vocab_size=cfg.global_vocab_size)
    raise IntegrationError("zephon: source_loss measures cross entropy, but this job's loss is "
                           f"{type(cfg).__qualname__}; turn source_loss off")
