"""TorchTitan 0.3.x: the loader class, its Config and the trainer lookup."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from torchtitan.components.dataloader import BaseDataLoader

from zephon_torchtitan.core import DEFAULT_STATE_CAPACITY, Settings, StreamLoader, ZephonStream


def _building_trainer() -> Any | None:
    """The Trainer whose ``__init__`` is building this loader, if any.

    TorchTitan 0.3 does not pass the global batch size or the pipeline
    microbatch count to a loader, but the Trainer has computed both before it
    builds the loader, so the start-up validator reads them from it.
    """
    frame = inspect.currentframe()
    try:
        while frame is not None:
            owner = frame.f_locals.get("self")
            if owner is not None and hasattr(owner, "gradient_accumulation_steps") and hasattr(owner, "parallel_dims"):
                return owner
            frame = frame.f_back
    finally:
        del frame
    return None


def batches_per_optimizer_step(global_batch_size: int, local_batch_size: int, dp_world_size: int) -> int | None:
    """Batches all data-parallel ranks consume per optimizer step."""
    if global_batch_size > 0:
        return global_batch_size // local_batch_size
    trainer = _building_trainer()
    if trainer is None:
        return None
    return trainer.gradient_accumulation_steps * getattr(trainer, "num_pipeline_parallel_microbatches", 1) * dp_world_size


class ZephonDataLoader(StreamLoader, BaseDataLoader):
    """Zephon's deterministic, elastic loader in TorchTitan 0.3's loader slot."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        recipe: str = ""
        """TOML data recipe: sources, weights, seed, packing, canonical_replicas, aggregation."""
        canonical_replicas: int = 0
        """Lanes; 0 takes the recipe's value (or the first dp degree)."""
        aggregate_dir: str = ""
        """Shared folder or object-store prefix where ranks merge checkpoints; "" takes the recipe's."""
        run_id: str = ""
        """Unique name of this training run in aggregate_dir; "" takes the recipe's."""
        aggregate_timeout_s: float = 0.0
        """Seconds rank 0 waits for the others at a checkpoint; 0 takes the recipe's (default 180)."""
        global_batch_size: int = 0
        """Only when the loader is built outside a Trainer: samples per optimizer step."""
        state_capacity_bytes: int = DEFAULT_STATE_CAPACITY
        """Fixed size of the checkpoint slot; keep it equal between a save and its resume."""
        infinite: bool = True
        """False for validation: one pass over a finite held-out recipe."""

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
        settings = Settings(
            recipe=config.recipe,
            canonical_replicas=config.canonical_replicas,
            aggregate_dir=config.aggregate_dir,
            run_id=config.run_id,
            aggregate_timeout_s=config.aggregate_timeout_s,
            global_batch_size=config.global_batch_size,
            state_capacity_bytes=config.state_capacity_bytes,
        )
        validation = not config.infinite
        self._stream = ZephonStream(
            settings,
            dp_world_size=dp_world_size,
            dp_rank=dp_rank,
            tokenizer=tokenizer,
            seq_len=seq_len,
            local_batch_size=local_batch_size,
            batches_per_step=None if validation else batches_per_optimizer_step(config.global_batch_size, local_batch_size, dp_world_size),
            validation=validation,
        )
