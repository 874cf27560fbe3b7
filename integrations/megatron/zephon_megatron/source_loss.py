"""Per-source training loss on Megatron (``--zephon-source-loss``, the wheel entry ``zephon_megatron.pretrain_gpt``).

Each micro-batch carries ``zephon_sources`` (``zephon_core.integration.label_sources``: a source id per
label, ``-1`` on padding), through the adapter's tensor-parallel broadcast too. ``pretrain_gpt.loss_func``
adds every counted label's loss to its source on the last pipeline stage (training calls only: evaluation
runs without gradient). Every ``--log-interval``, on every rank (Megatron calls ``training_log`` on all):

* one all-reduce (sum) of the ``[2, n_sources]`` table over the data-parallel group, then
* under pipeline parallelism, one broadcast over the pipeline group from its last stage, so the loading
  ranks of the first stage hold the figures the last stage computed.

The last rank writes ``zephon/loss/<source>`` and ``zephon/loss_tokens/<source>`` to Megatron's TensorBoard
and W&B writers and prints a console line; under pipeline parallelism rank 0 (a loading rank of the first
stage) prints the figures the broadcast gave it too, so the log shows both ends of it. Every rank hands the
figures to ``publish_source_loss``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from zephon_core.integration import SourceLoss, publish_source_loss, source_loss_of
from zephon_megatron.broadcast import comm_device

#: The micro-batch key of the label source ids.
SOURCES_KEY = "zephon_sources"


class MegatronSourceLoss:
    """This rank's per-source loss since the previous logged iteration, and its reduction."""

    def __init__(self, names: tuple[str, ...], *, log_interval: int, writes: bool,
                 writers: Callable[[], tuple[Any, Any]] | None = None, shows_received: bool = False) -> None:
        self.names = names
        self.log_interval = max(1, int(log_interval))
        self.writes = writes
        self.shows_received = shows_received  # rank 0 of the first pipeline stage, under PP
        self._writers = writers
        self._table = torch.zeros(2, len(names), dtype=torch.float64)

    def add(self, per_token: torch.Tensor, loss_mask: torch.Tensor, sources: torch.Tensor) -> None:
        """One training micro-batch's per-token loss, its mask and its label source ids (all ``[B, L]``)."""
        with torch.no_grad():
            ids = sources.reshape(-1).to(per_token.device)
            keep = (ids >= 0) & (loss_mask.reshape(-1) > 0)
            src = ids[keep].to(torch.int64)
            self._table = self._table.to(per_token.device)
            self._table[0].index_add_(0, src, per_token.detach().float().reshape(-1)[keep].double())
            self._table[1].index_add_(0, src, torch.ones(len(src), dtype=torch.float64, device=per_token.device))

    def at_iteration(self, iteration: int) -> SourceLoss | None:
        """After Megatron's ``training_log``: every ``--log-interval``, the interval's figures, equal on every rank."""
        if iteration % self.log_interval:
            return None
        table, self._table = self._table, torch.zeros(2, len(self.names), dtype=torch.float64)
        figures = source_loss_of(iteration, self.names, reduce_table(table).tolist())
        if self.writes:
            self.write(figures)
        elif self.shows_received:
            _console(f"{figures.line()} | iteration {figures.step} | received from the last pipeline stage")
        publish_source_loss(figures)
        return figures

    def write(self, figures: SourceLoss) -> None:
        """Into Megatron's writers at the figures' iteration, and one console line."""
        tensorboard, wandb = self._writers() if self._writers is not None else (None, None)
        scalars = figures.scalars()
        if tensorboard is not None:
            for name, value in scalars.items():
                tensorboard.add_scalar(name, value, figures.step)
        if wandb is not None:
            wandb.log(scalars, figures.step)
        _console(f"{figures.line()} | iteration {figures.step}")


def _console(line: str) -> None:
    # One write with its newline: with unbuffered output, print's separate newline lets another rank's line in.
    print(line + "\n", end="", flush=True)


def reduce_table(table: torch.Tensor) -> torch.Tensor:
    """``table`` summed over the data-parallel group, then broadcast from the last pipeline stage."""
    if not (dist.is_available() and dist.is_initialized()):
        return table
    from megatron.core import mpu

    dp_group = mpu.get_data_parallel_group()
    out = table.to(comm_device(dp_group)).contiguous()
    dist.all_reduce(out, group=dp_group)
    if mpu.get_pipeline_model_parallel_world_size() > 1:
        pp_group = mpu.get_pipeline_model_parallel_group()
        last = dist.get_global_rank(pp_group, dist.get_world_size(pp_group) - 1)
        out = out.to(comm_device(pp_group))
        dist.broadcast(out, src=last, group=pp_group)
    return out.cpu()
