"""Zephon's figures in Megatron's own logs, every ``--log-interval`` (``--zephon-log-metrics``).

Megatron writes TensorBoard and W&B on its last rank (``world_size - 1``) and prints
its training line there. A Pipeline lives only on tensor-parallel rank 0 of the loading
stages, so as soon as TP > 1 the last rank holds none; and under pipeline parallelism
the last stage's Pipelines never take part in a checkpoint, so their ``run/...``
figures would stay those of the state they resumed from.

The figures therefore come from global rank 0, whatever the layout: it has every
coordinate 0, so it is tensor-parallel rank 0 of the first stage with context-parallel
rank 0, the Pipeline of data-parallel rank 0 that takes part in checkpoints (its
``run/...`` figures follow every checkpoint). They reach the last rank by one small
object broadcast per logged iteration over a two-rank group made for it at start-up.
Riding along with the micro-batch broadcast was not an option: that one runs over a
tensor-parallel group, which does not join the first stage to the last, and on the
launch route it is Megatron's own ``get_batch_on_this_tp_rank``, which carries only
tensors of fixed shapes. Ranks other than those two take no part; with the option off
nothing here is built and no snapshot is taken.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zephon_core.integration import IntervalMetrics, LoggedFigures
from zephon_megatron.iterators import TrainStream
from zephon_megatron.validate import ZephonMegatronError

#: The rank whose Pipeline the figures describe (see the module docstring).
SOURCE_RANK = 0


def megatron_writers() -> tuple[Any, Any]:
    """Megatron's TensorBoard and W&B writers of this process (None where it has none)."""
    from megatron.training.global_vars import get_tensorboard_writer, get_wandb_writer

    return get_tensorboard_writer(), get_wandb_writer()


def _print(line: str) -> None:
    print(line, flush=True)


class MegatronMetrics:
    """This rank's part in logging Zephon's figures: taking them (rank 0), writing them (the last rank), or both."""

    def __init__(self, stream: TrainStream | None, *, rank: int, world_size: int, log_interval: int,
                 relay: Any = None, writers: Callable[[], tuple[Any, Any]] = megatron_writers,
                 emit: Callable[[str], None] = _print) -> None:
        if rank == SOURCE_RANK and stream is None:
            raise ZephonMegatronError("zephon: --zephon-log-metrics: global rank 0 holds no Zephon Pipeline; "
                                      "this layout is not supported")
        self.stream = stream
        self.rank = rank
        self.writer_rank = world_size - 1
        self.log_interval = max(1, int(log_interval))
        self._relay = relay
        self._interval = IntervalMetrics() if rank == SOURCE_RANK else None
        self._writers = writers
        self._emit = emit

    @classmethod
    def set_up(cls, args: Any, stream: TrainStream | None) -> MegatronMetrics | None:
        """This rank's part, or None when it has none. Call it on every rank: the relay group is made collectively."""
        import torch.distributed as dist

        distributed = dist.is_available() and dist.is_initialized()
        rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
        writer = world - 1
        relay = dist.new_group([SOURCE_RANK, writer]) if writer != SOURCE_RANK else None
        if rank not in (SOURCE_RANK, writer):
            return None
        interval = int(getattr(args, "log_interval", 1) or 1)
        return cls(stream, rank=rank, world_size=world, log_interval=interval, relay=relay)

    def at_iteration(self, iteration: int) -> None:
        """After Megatron's ``training_log`` of ``iteration``: every ``--log-interval``, the interval ending here."""
        if iteration % self.log_interval:
            return
        figures = None
        if self._interval is not None and self.stream is not None:
            figures = self._interval.take(self.stream.delivering.stats())
        if self._relay is not None:
            import torch.distributed as dist

            box: list[LoggedFigures | None] = [figures]
            dist.broadcast_object_list(box, src=SOURCE_RANK, group=self._relay)
            figures = box[0]
        if self.rank == self.writer_rank and figures is not None:
            self.write(figures, iteration)

    def write(self, figures: LoggedFigures, iteration: int) -> None:
        """Into Megatron's writers at ``iteration``, and one console line."""
        tensorboard, wandb = self._writers()
        if tensorboard is not None:
            for name, value in figures.scalars.items():
                tensorboard.add_scalar(name, value, iteration)
        if wandb is not None:
            wandb.log(figures.scalars, iteration)
        self._emit(f"{figures.line} | iteration {iteration}")
