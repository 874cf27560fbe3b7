"""TorchTitan 0.3 under torchft, fed by Zephon's live mode: every committed step keeps exactly its samples.

``ZephonFTTrainer`` is TorchTitan's ``FaultTolerantTrainer`` (``torchtitan.experiments.torchft``), its
parts subclassed, none copied:

* ``ZephonFTManager`` (the ``fault_tolerance`` component): a rank's data identity is its data-parallel
  rank *inside* its replica group, not TorchTitan FT's static ``replica_id`` shard, because the replica
  groups split each data-parallel rank's slot of lanes anew at every step; and torchft's Manager gets
  ``init_sync`` from the config (default False; TorchTitan 0.3.0 leaves torchft's True, which live
  mode refuses with async quorum).
* ``ZephonFTOptimizers``: once ``zero_grad()`` has started the step's quorum, the trainer takes this
  attempt's micro-batches from the lanes (``LiveData.begin``) and sets ``gradient_accumulation_steps``
  to their number, which depends on how many replica groups take part.
* ``forward_backward_step`` weights each micro-batch's loss by ``plan.loss_scale`` (TorchTitan's loss is
  already divided by the valid tokens of all the step's micro-batches; a pad has no valid label) and after
  the last one exchanges the lanes' table (``LiveData.exchange``); ``train_step``
  settles the attempt after TorchTitan's optimizer step (it committed when torchft's
  ``current_step()`` advanced) and logs it.

Zephon's durable state is the dataloader entry of TorchTitan's main checkpoint (the committed lanes,
``LiveLanes.checkpoint``); TorchTitan FT's per-replica dataloader checkpoints must be off. With
``ZEPHON_BATCH_LOG`` set, every attempt's real batches go to the batch audit log when they are cut,
and one line per attempt to the step log beside it (``<batch log>.steps``, ``read_step_log``).
"""

from __future__ import annotations

import dataclasses
import os
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TextIO

import torch
from torchtitan.components.loss import ChunkedLossWrapper
from torchtitan.components.optimizer import OptimizersContainer
from torchtitan.experiments.torchft.checkpoint import TorchFTCheckpointManager
from torchtitan.experiments.torchft.config.job_config import FaultTolerance
from torchtitan.experiments.torchft.manager import TorchFTManager
from torchtitan.experiments.torchft.optimizer import TorchFTOptimizersContainer
from torchtitan.experiments.torchft.trainer import FaultTolerantTrainer
from torchtitan.trainer import Trainer

from zephon_core import Batch
from zephon_core.integration import BATCH_LOG_ENV, Audited, IntegrationError, audited, log_identity, refuse
from zephon_core.live import LiveLanes, LiveStep, live_data_problems
from zephon_torchft import LiveData
from zephon_torchtitan.core import IGNORE_INDEX, ZephonStream, coordination_identity, to_torchtitan
from zephon_torchtitan.tt03 import WITHOUT_TORCHFT, ZephonDataLoader, fill_batch_sizes

STEP_LOG_SUFFIX = ".steps"


class ZephonFTManager(TorchFTManager):
    """TorchTitan's torchft manager component, with the data identity of a rank inside its replica group."""

    @dataclass(kw_only=True, slots=True)
    class Config(FaultTolerance):
        init_sync: bool = False
        """torchft Manager init_sync: False (every replica group starts from the same seed or checkpoint) is what
        live mode needs with async quorum; True commits step 0 without the lanes of the groups healing at start."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        if self.enabled:
            # TorchTitan 0.3.0 builds the Manager with torchft's default; torchft reads it at each quorum only.
            self.manager._init_sync = config.init_sync

    def get_dp_info(self, dp_degree: int, dp_rank: int) -> tuple[int, int]:
        """The data-parallel degree and rank inside this replica group: the lanes are split across the groups
        at every step by the live lanes, not statically by ``replica_id``."""
        return dp_degree, dp_rank


class ZephonFTOptimizers(TorchFTOptimizersContainer):
    """TorchTitan FT's optimizers, calling ``on_quorum`` after the ``zero_grad()`` that starts a step's quorum."""

    @dataclass(kw_only=True, slots=True)
    class Config(TorchFTOptimizersContainer.Config):
        pass

    def __init__(self, config: Config, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.on_quorum: Callable[[], None] | None = None

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        starts_quorum = self._use_ft_optimizer  # False in the inner call torchft's wrapper makes back into this one
        super().zero_grad(*args, **kwargs)
        if starts_quorum and self.on_quorum is not None:
            self.on_quorum()


def _fields(cfg: Any) -> dict[str, Any]:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}


def on_zephon_ft_trainer(cfg: Trainer.Config) -> ZephonFTTrainer.Config:
    """The same job on ``ZephonFTTrainer`` in live mode: fault tolerance on (torchft over gloo unless set),
    TorchTitan FT's checkpoint manager without its per-replica dataloader checkpoints, torchft's optimizer."""
    out = ZephonFTTrainer.Config(**{k: v for k, v in _fields(cfg).items() if k != "fault_tolerance"})
    ft = getattr(cfg, "fault_tolerance", None)
    out.fault_tolerance = ZephonFTManager.Config(**{**(_fields(ft) if ft is not None else {}), "enable": True})
    checkpoint = {**_fields(cfg.checkpoint), "enable_ft_dataloader_checkpoints": False}
    out.checkpoint = TorchFTCheckpointManager.Config(**checkpoint)
    out.optimizer = ZephonFTOptimizers.Config(**_fields(cfg.optimizer))
    return out


def live_config_problems(config: Trainer.Config) -> list[str]:
    """Live mode's rules on TorchTitan's settings, one line each naming the setting and the fix (empty: all hold)."""
    ft, ckpt, out = getattr(config, "fault_tolerance", None), config.checkpoint, []
    if ft is None or not ft.enable:
        out.append("live mode runs under torchft: set --fault_tolerance.enable")
    elif ft.semi_sync_method is not None:
        out.append(f"--fault_tolerance.semi_sync_method={ft.semi_sync_method!r} syncs every few steps; live mode "
                   "commits the lanes at every step: leave it unset")
    if not isinstance(config.dataloader, ZephonDataLoader.Config) or not config.dataloader.infinite:
        out.append("live mode needs the Zephon training loader; this job's dataloader is "
                   f"{type(config.dataloader).__qualname__}")
    if not isinstance(config.optimizer, OptimizersContainer.Config):
        out.append("live mode needs TorchTitan's optimizers container; this job's optimizer is "
                   f"{type(config.optimizer).__qualname__}")
    if config.parallelism.pipeline_parallel_degree > 1:
        out.append("live mode does not support pipeline parallelism: set --parallelism.pipeline_parallel_degree 1")
    if not ckpt.enable:
        out.append("torchft heals a joining replica group from the checkpoint manager's state (model, optimizer, "
                   "trainer step): set --checkpoint.enable")
    if getattr(ckpt, "enable_ft_dataloader_checkpoints", False):
        out.append("Zephon's state is in the main checkpoint (the committed lanes), not in TorchTitan FT's per-replica "
                   "dataloader checkpoints: set --checkpoint.enable_ft_dataloader_checkpoints false")
    if ft is not None and not getattr(ft, "init_sync", True) and config.debug.seed is None:
        out.append("with init_sync false torchft does not copy the weights at the first step, so every replica group "
                   "must initialise them alike: set --debug.seed")
    return out


def live_start_problems(stream: ZephonStream) -> list[str]:
    """Live mode's refusal of the loader state it starts from (after the checkpoint's restore): a journaled skip
    (``zephon skip``, an earlier ``[surgery]``) its lanes have not passed. Steering and a ``[surgery]`` table are
    refused when the loader is built (``tt03``)."""
    ahead = stream.skips_ahead()
    return live_data_problems(skip_ahead=str(ahead[0]) if ahead else None, without_torchft=WITHOUT_TORCHFT)


def batches_per_lane(batches_per_step: int | None, canonical_replicas: int) -> int:
    """``k``: batches each lane delivers per optimizer step (the stream's step-size rule made the division exact)."""
    if not batches_per_step or batches_per_step % canonical_replicas:
        raise IntegrationError("zephon live mode: the loader does not know the batches per optimizer step "
                               "(global_batch_size / local_batch_size); run it on ZephonFTTrainer")
    return batches_per_step // canonical_replicas


def pad_batch(local_batch_size: int, seq_len: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A pad micro-batch: no valid label, so its loss and its gradient are 0."""
    positions = torch.arange(seq_len, dtype=torch.int64).repeat(local_batch_size, 1)
    inputs = torch.zeros(local_batch_size, seq_len, dtype=torch.int64)
    labels = torch.full((local_batch_size, seq_len), IGNORE_INDEX, dtype=torch.int64)
    return {"input": inputs, "positions": positions}, labels


def weighted_tokens(global_valid_tokens: torch.Tensor, weight: float) -> torch.Tensor:
    """The loss divisor that weights a micro-batch's summed loss by ``weight`` (TorchTitan divides it by the tokens).

    A pad (weight 0) has no valid label, so its summed loss is 0 whatever the divisor: it only must not be 0."""
    if weight == 1.0:
        return global_valid_tokens
    if weight == 0.0:
        return global_valid_tokens.clamp(min=1)
    return global_valid_tokens / weight


def loss_weights(attempt: LiveStep) -> list[float]:
    """Each micro-batch's loss weight in TorchTitan: ``plan.loss_scale`` for a real batch, 0 for a pad.

    TorchTitan divides a micro-batch's summed loss by the valid tokens of all the step's micro-batches, so its losses
    already sum to the mean over them: they take the step's weight, not ``microbatches()``'s per-micro-batch one (which
    holds the ``1 / microbatches`` TorchTitan has applied)."""
    return [attempt.plan.loss_scale if batch is not None else 0.0 for batch, _ in attempt.microbatches()]


class StepRecord(NamedTuple):
    """One line of the step log: an attempt of Zephon step ``step`` and how it ended."""

    step: int
    committed: bool
    participants: int
    position: int | None
    """``participating_rank()``: None when the replica group did not take part (healing)."""
    lanes: tuple[int, ...]
    trainer_step: int


def step_line(step: int, attempt: LiveStep, committed: bool, trainer_step: int) -> str:
    """``step outcome participants index lanes trainer_step``: ``step`` is the Zephon step the attempt committed
    (a healing replica group's attempt commits the step it healed to), or the one it tried."""
    plan = attempt.plan
    lanes = ",".join(map(str, plan.lanes)) or "-"
    index = "-" if plan.index is None else str(plan.index)
    return f"{step} {'committed' if committed else 'discarded'} {plan.participants} {index} {lanes} {trainer_step}\n"


def read_step_log(path: str | os.PathLike[str]) -> list[StepRecord]:
    """The attempts of one step log, in order."""
    out = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        step, outcome, participants, index, lanes, trainer_step = line.split()
        position = None if index == "-" else int(index)
        owned = tuple(int(x) for x in lanes.split(",")) if lanes != "-" else ()
        out.append(StepRecord(int(step), outcome == "committed", int(participants), position, owned, int(trainer_step)))
    return out


def _open_step_log(rank: int) -> TextIO | None:
    pattern = os.environ.get(BATCH_LOG_ENV)
    if not pattern:
        return None
    return open(pattern.replace("{rank}", str(rank)) + STEP_LOG_SUFFIX, "a", encoding="utf-8", buffering=1)


class _Feed:
    """The micro-batches of the current attempt, in order, for TorchTitan's ``next(data_iterator)``."""

    def __init__(self) -> None:
        self.queue: deque[tuple[dict[str, torch.Tensor], torch.Tensor]] = deque()

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        return self

    def __next__(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        if not self.queue:  # never StopIteration: TorchTitan would take it for the end of the data
            raise IntegrationError("zephon live mode: the trainer asked for more micro-batches than this step has")
        return self.queue.popleft()


def _name_replica_group(config: Trainer.Config) -> None:
    """Each replica group checkpoints its own ranks: the loader's plan gives each its own aggregation folder
    (``run_id-replicaN``) when it loads the recipe, the one time it does."""
    loader, ft = config.dataloader, getattr(config, "fault_tolerance", None)
    if isinstance(loader, ZephonDataLoader.Config) and ft is not None and ft.enable:
        loader.replica_group = ft.replica_id


class ZephonFTTrainer(FaultTolerantTrainer):
    """TorchTitan's fault-tolerant trainer whose replica groups share Zephon's lanes step by step (live mode).

    Return ``ZephonFTTrainer.Config`` from a recipe function, or turn any recipe into one with
    ``on_zephon_ft_trainer``; ``--module zephon_torchtitan --config llama3_debugmodel_zephon_ft`` is one.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(FaultTolerantTrainer.Config):
        pass

    def __init__(self, config: FaultTolerantTrainer.Config) -> None:
        fill_batch_sizes(config)
        if not isinstance(config.fault_tolerance, ZephonFTManager.Config):
            config.fault_tolerance = ZephonFTManager.Config(**_fields(config.fault_tolerance))
        opt = config.optimizer
        if isinstance(opt, OptimizersContainer.Config) and not isinstance(opt, ZephonFTOptimizers.Config):
            config.optimizer = ZephonFTOptimizers.Config(**_fields(config.optimizer))
        problems = live_config_problems(config)
        if problems:
            raise IntegrationError("zephon live mode: " + "; ".join(problems))
        _name_replica_group(config)
        super().__init__(config)
        # Trainer.__init__ wires the chunked loss to the model's lm_head; FaultTolerantTrainer 0.3.0's does not.
        if isinstance(self.loss_fn, ChunkedLossWrapper):
            self.loss_fn.set_lm_head(self.model_parts[0].lm_head)
            self.model_parts[0]._skip_lm_head = True
        assert isinstance(self.optimizers, ZephonFTOptimizers)
        self.optimizers.on_quorum = self._begin_attempt
        self._live: LiveData | None = None
        self._attempt: LiveStep | None = None
        self._weights: list[float] = []
        self._done = 0
        self._feed = _Feed()
        self._batches = self.batch_generator(self._feed)
        rank = coordination_identity()[1]
        # Each attempt's batches are logged when cut (``over``); a pad (None) is not a batch.
        self._cut: Audited[tuple[Batch | None, float]] = audited(
            (), rank, batch_of=lambda item: item[0], identity=log_identity(self.stream.pipeline.definition()))
        self._step_log = _open_step_log(rank)

    @property
    def stream(self) -> ZephonStream:
        return self.dataloader._stream

    def _start_live(self) -> None:
        """Live lanes from the pipeline as the checkpoint (if any) left it; torchft may replace them when healing."""
        stream = self.stream
        refuse(live_start_problems(stream))
        ident = stream.pipeline.identity
        live = LiveLanes(stream.pipeline, batches_per_lane(stream.batches_per_step, ident.canonical_replicas))
        self._live = LiveData(live, self.ft_manager.manager, slots=ident.dp_degree)
        stream.live = live

    def train_step(self, data_iterator: Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]) -> None:
        """One step attempt: TorchTitan's, on this attempt's micro-batches; then the attempt is settled."""
        if self._live is None:
            self._start_live()
        self._attempt, self._weights, self._done = None, [], 0
        self._feed.queue.clear()
        super().train_step(self._batches)
        self._settle()

    def _begin_attempt(self) -> None:
        """After the quorum started: this attempt's micro-batches and their number."""
        assert self._live is not None
        attempt = self._live.begin()
        self._attempt = attempt
        training = self.config.training
        for batch, _ in self._cut.over(attempt.microbatches()):
            self._feed.queue.append(to_torchtitan(batch) if batch is not None else pad_batch(training.local_batch_size,
                                                                                              training.seq_len))
        self._weights = loss_weights(attempt)
        self.gradient_accumulation_steps = attempt.plan.microbatches

    def forward_backward_step(self, *, input_dict: Any, labels: Any, global_valid_tokens: torch.Tensor) -> torch.Tensor:
        """TorchTitan's, with the micro-batch's loss weight; the lanes' table is exchanged after the last one."""
        weight = self._weights[self._done]
        self._done += 1
        loss = super().forward_backward_step(input_dict=input_dict, labels=labels,
                                             global_valid_tokens=weighted_tokens(global_valid_tokens, weight))
        if self._done == len(self._weights):
            assert self._live is not None
            self._live.exchange()
        return loss

    def _settle(self) -> None:
        assert self._live is not None and self._attempt is not None
        committed = self._live.settle()
        if self._step_log is not None:
            step = self._live.live.step - 1 if committed else self._attempt.step
            self._step_log.write(step_line(step, self._attempt, committed, self.step))

    def close(self) -> None:
        cut, step_log = getattr(self, "_cut", None), getattr(self, "_step_log", None)
        if cut is not None:
            cut.close()
        if step_log is not None:
            step_log.close()
        live = getattr(self, "_live", None)
        if live is not None:
            live.live.close()
        super().close()
