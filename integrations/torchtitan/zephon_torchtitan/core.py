"""What both TorchTitan generations share: the start-up plan from TorchTitan's facts, building the
Pipeline, the batch format and the checkpoint slot.

Imports torch, never torchtitan: the version-specific glue lives in
``tt03.py`` (0.3.x, config recipes and overrides) and ``tt02.py`` (0.2.x,
TOML job files); the settings both declare, in ``settings.py``.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from zephon_core import Batch, Pipeline
from zephon_core.integration import (
    Asked,
    Facts,
    IntegrationError,
    MixingLoader,
    Skip,
    StartupPlan,
    SurgeryJournal,
    Terms,
    apply_surgery,
    audited,
    lanes_line,
    log_identity,
    next_multiple,
    parse_lanes,
    refuse,
    restored_line,
    startup_line,
    startup_plan,
)
from zephon_core.integration.announce import surgery_line
from zephon_torchtitan.settings import (
    DEFAULT_STATE_CAPACITY as DEFAULT_STATE_CAPACITY,  # re-exported beside the slot it sizes
)
from zephon_torchtitan.settings import Settings
from zephon_torchtitan.source_loss import SourceLossTally

#: TorchTitan's ignore index for labels (torchtitan.components.loss.IGNORE_INDEX).
IGNORE_INDEX = -100
#: DCP key under ``dataloader.``; one value, identical on every rank (the merged state).
STATE_KEY = "zephon_state"
#: TorchTitan logs through the root logger: this child's records print among its own lines.
LOG = logging.getLogger("zephon_torchtitan")
#: Why a plain TorchTitan 0.3 Trainer cannot take a journal that skips steps ahead, and the fix.
PLAIN_TRAINER = ("TorchTitan's Trainer would train the batches after them as those steps (its step numbers would "
                 "shift); run the job on zephon_torchtitan.ZephonTrainer (--module zephon_torchtitan, or return "
                 "zephon_torchtitan.config_registry.on_zephon_trainer(cfg) from your recipe function)")

class TokenizerAdapter:
    """Encodes with a TorchTitan tokenizer; batch-encodes through its ``tokenizers.Tokenizer``."""

    def __init__(self, tokenizer: Any) -> None:
        self._tt = tokenizer
        self._fast = getattr(tokenizer, "tokenizer", None)
        self.bos_id = getattr(tokenizer, "bos_id", None)
        self.eos_id = getattr(tokenizer, "eos_id", None)
        if self._fast is not None and hasattr(self._fast, "to_str"):
            self.to_str = self._fast.to_str
            self.encode_batch = self._fast.encode_batch
            self.zephon_identity = None
        else:
            self.zephon_identity = f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}"

    def encode(self, text: str) -> list[int]:
        return list(self._tt.encode(text, add_bos=False, add_eos=False))

    def __reduce__(self) -> Any:  # for runner="process": ship the wrapped tokenizer
        return (TokenizerAdapter, (self._tt,))


#: TorchTitan's names for what the start-up rules talk about.
TERMS = Terms(
    dp="data-parallel degree",
    dp_detail=" (dp_replicate x dp_shard)",
    canonical_replicas="canonical_replicas (the loader option or the recipe's)",
    aggregate_dir="aggregate_dir",
    run_id="run_id",
    step=lambda n: f"{n} batches over all data-parallel ranks (global_batch_size / local_batch_size)",
    step_fix=lambda C, n: f"make it a multiple of {C} (e.g. global_batch_size = local_batch_size x {next_multiple(n, C)})",
)


def to_torchtitan(b: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A Zephon batch as TorchTitan's ``(input_dict, labels)``; labels outside the loss mask are the ignore index."""
    labels = np.where(b.loss_mask, b.labels, IGNORE_INDEX)
    inputs = {"input": torch.from_numpy(b.input_ids), "positions": torch.from_numpy(b.positions)}
    return inputs, torch.from_numpy(labels)


def coordination_identity() -> tuple[int, int]:
    """Every rank builds a Pipeline, so the coordination group is the whole job."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def launched_rank() -> int | None:
    """This process's global rank when it is one of a job's processes (None: a process of its own)."""
    world_size, rank = coordination_identity()
    return rank if world_size > 1 else None


def asked_of(settings: Settings, run_id_suffix: str = "") -> Asked:
    """What the user set through the adapter (empty or 0: unset, the recipe's or the default applies), and the
    suffix of a torchft replica group's run_id."""
    return Asked(canonical_replicas=settings.canonical_replicas or None, aggregate_dir=settings.aggregate_dir or None,
                 run_id=settings.run_id or None, aggregate_timeout_s=settings.aggregate_timeout_s or None,
                 run_id_suffix=run_id_suffix)


def facts_of(*, dp_world_size: int, dp_rank: int, local_batch_size: int, batches_per_step: int | None,
             validation: bool = False) -> Facts:
    """TorchTitan's facts of one loader: every rank builds a pipeline, so the coordination group is the whole
    job; a validation loader never checkpoints (no coordination, no step-size rule)."""
    if validation:
        return Facts(dp_degree=dp_world_size, dp_rank=dp_rank)
    world_size, global_rank = coordination_identity()
    return Facts(dp_degree=dp_world_size, dp_rank=dp_rank, world_size=world_size, global_rank=global_rank,
                 batches_per_step=batches_per_step,
                 # Rows per optimizer step, checked against a recipe whose stages start at optimizer steps.
                 rows_per_step=batches_per_step * local_batch_size if batches_per_step else None)


def plan_of(settings: Settings, facts: Facts, run_id_suffix: str = "") -> StartupPlan:
    """The loader's start-up plan: the recipe loaded once, the lanes and the coordination resolved once."""
    return startup_plan(settings.recipe, facts, asked_of(settings, run_id_suffix), framework="TorchTitan")


class ZephonStream:
    """A Pipeline plus the conversion to TorchTitan's batches and checkpoint slot."""

    def __init__(
        self,
        settings: Settings,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: Any,
        seq_len: int,
        local_batch_size: int,
        batches_per_step: int | None,
        validation: bool = False,
        run_id_suffix: str = "",
        source_loss: bool = False,
        mixing: bool = False,
    ) -> None:
        # Settings -> plan -> refuse -> build.
        facts = facts_of(dp_world_size=dp_world_size, dp_rank=dp_rank, local_batch_size=local_batch_size,
                         batches_per_step=batches_per_step, validation=validation)
        self.plan: StartupPlan = plan_of(settings, facts, run_id_suffix)
        refuse(self.plan.problems(TERMS), rank=launched_rank())
        recipe = self.plan.recipe
        tok = TokenizerAdapter(tokenizer) if not recipe.pretokenized else None
        # pipelines_per_node is left to the core's default: LOCAL_WORLD_SIZE, set by torchrun.
        self._built: Pipeline = recipe.build(
            seq_len=seq_len,
            batch_size=local_batch_size,
            tokenizer=tok,
            bos_id=tok.bos_id if tok else None,
            eos_id=tok.eos_id if tok else None,
            global_batch_size=self.plan.stage_rows,
            **self.plan.options(),
        )
        self.capacity = settings.state_capacity_bytes
        self.batches_per_step = facts.batches_per_step
        #: Live mode's lanes (``zephon_torchtitan.ft``): it cuts the batches, and checkpoints hold its committed lanes.
        self.live: Any = None
        #: Per-source training loss (``source_loss``): the label source ids of the batches handed out.
        self.source_loss = (SourceLossTally(tuple(s.name for s in self._built.work_source.sources))
                            if source_loss and not validation else None)
        #: The recipe's ``[mixing]`` steering this stream's mixture (``mixing``; ``zephon_torchtitan.steering``).
        self.mixing = self._mixing_loader(settings.recipe) if mixing and not validation else None
        self._iter: Iterator[Any] | None = None
        #: Whether the recipe's ``[surgery]`` table is applied (a validation stream has none to apply).
        self._surgery_applied = validation
        #: Why a journal that skips steps ahead is refused at the first batch; None: the trainer runs no training
        #: for a skipped step (``ZephonTrainer``), so the lanes' skip keeps its step numbers.
        self.skips_refused: str | None = PLAIN_TRAINER
        if not validation:
            _TRAINING_STREAM["latest"] = weakref.ref(self)
            self._announce()

    def _announce(self) -> None:
        """The start-up line on rank 0, each rank's lanes at debug level."""
        ident = self.pipeline.identity
        if ident.global_rank == 0:
            LOG.info(startup_line(self.plan, "TorchTitan"))
        LOG.debug(lanes_line(coordination_identity()[1], ident.dp_group_id, ident.lanes))

    def _mixing_loader(self, recipe_path: str) -> MixingLoader:
        mixing = self.plan.recipe.mixing()
        if mixing is None:
            raise IntegrationError(f"zephon: mixing is on, but the recipe {recipe_path} has no [mixing] table; "
                                   "add one (docs/mixing.md) or turn mixing off")
        if self.source_loss is None:
            raise IntegrationError("zephon: mixing steers by the per-source loss; turn source_loss on too "
                                   "(with zephon_torchtitan.zephon_source_loss and zephon_metrics)")
        return MixingLoader(self._built, mixing)

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline delivering now: under ``mixing``, the one built for the last decision."""
        return self.mixing.pipeline if self.mixing is not None else self._built

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        if self.live is not None:
            raise IntegrationError("zephon: in live mode the trainer takes each step's batches from the live lanes, "
                                   "not by iterating the loader")
        if self._iter is None:
            self.surgery()  # a fresh run's table, before its first batch
            self.refuse_skips_ahead()
            # The MixingLoader itself: it follows each decision's rebuilt pipeline.
            self._iter = iter(self.mixing if self.mixing is not None else self._built)
        for b in audited(self._iter, coordination_identity()[1], identity=log_identity(self._built.definition())):
            if self.source_loss is not None:
                self.source_loss.delivered(b)
            yield to_torchtitan(b)

    # -- checkpoint slot ------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        owner = self.live if self.live is not None else self.mixing if self.mixing is not None else self._built
        return {STATE_KEY: encode_state(owner.checkpoint(), self.capacity)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if STATE_KEY not in state_dict:
            raise IntegrationError(
                f"zephon: the checkpoint's dataloader state has no {STATE_KEY!r} (keys: {sorted(state_dict)}); it was not written by the Zephon loader"
            )
        state = decode_state(state_dict[STATE_KEY])
        # Under mixing the journal in the state is replayed, whatever the data-parallel degree.
        (self.mixing if self.mixing is not None else self._built).restore(state)
        if coordination_identity()[1] == 0:
            LOG.info(restored_line(state, dp_degree=self.plan.facts.dp_degree, step=None,
                                   batches_per_step=self.batches_per_step))
        self.surgery()

    # -- surgery (docs/when_a_run_goes_wrong.md) -------------------------------------
    def surgery(self) -> SurgeryJournal:
        """The pipeline's surgery journal, with the recipe's ``[surgery]`` table journaled into it the first time:
        after ``load_state_dict``'s restore, or before the first batch (or step) of a fresh run. What the journal
        holds already (a later resume with the table still in the recipe) is not journaled again."""
        if not self._surgery_applied:
            self._surgery_applied = True
            request = self.plan.recipe.surgery()
            if request.skips and not self.batches_per_step:
                raise IntegrationError(f"zephon: {request.where}: skip_steps needs the batches per optimizer step, "
                                       "which this loader was not told; use --module zephon_torchtitan (ZephonTrainer)")
            for done in apply_surgery(self.pipeline, request, self.batches_per_step or 1) if request else ():
                if coordination_identity()[1] == 0:
                    LOG.info(surgery_line(request.where, done))
        return self.pipeline.surgery

    def skip_at(self, step: int) -> Skip | None:
        """The journal's skip that leaves out global step ``step`` (None: it trains)."""
        return self.surgery().skip_at(step)

    def skips_ahead(self) -> list[Skip]:
        """The journal's skips that this rank's lanes have not yet moved past."""
        lanes = parse_lanes(self.pipeline.local_state())
        behind = min((ls.delivered for ls in lanes.values()), default=0)
        return [s for s in self.surgery().skips if s.lane_batches().stop > behind]

    def refuse_skips_ahead(self) -> None:
        """Refuse (one line) a journal that skips steps ahead when ``skips_refused`` says the trainer cannot."""
        if self.skips_refused is not None:
            ahead = self.skips_ahead()
            if ahead:
                raise IntegrationError(f"zephon: the loader state's surgery journal skips {ahead[0]}, but "
                                       f"{self.skips_refused}")


#: The training stream this process built last (TorchTitan builds one training loader per process),
#: for the metrics processor (``zephon_torchtitan.metrics``).
_TRAINING_STREAM: dict[str, weakref.ref[ZephonStream]] = {}


def training_stream() -> ZephonStream | None:
    """This process's training stream, for the metrics processor: TorchTitan hands neither one the other."""
    ref = _TRAINING_STREAM.get("latest")
    return ref() if ref is not None else None


class StreamLoader:
    """The loader methods both TorchTitan generations need, delegated to a ``ZephonStream``."""

    _stream: ZephonStream

    @property
    def pipeline(self) -> Pipeline:
        return self._stream.pipeline

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        return iter(self._stream)

    def state_dict(self) -> dict[str, Any]:
        return self._stream.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._stream.load_state_dict(state_dict)


def encode_state(state: dict[str, Any], capacity: int) -> torch.Tensor:
    """The state as JSON in a fixed-size uint8 tensor: 8-byte length, then the bytes."""
    data = json.dumps(state, sort_keys=True, separators=(",", ":")).encode()
    if len(data) + 8 > capacity:
        raise IntegrationError(f"zephon: the loader state needs {len(data) + 8} bytes, more than state_capacity_bytes={capacity}; raise it (for new runs)")
    buf = np.zeros(capacity, dtype=np.uint8)
    buf[:8] = np.frombuffer(len(data).to_bytes(8, "little"), dtype=np.uint8)
    buf[8 : 8 + len(data)] = np.frombuffer(data, dtype=np.uint8)
    return torch.from_numpy(buf)


def decode_state(value: Any) -> dict[str, Any]:
    """Inverse of ``encode_state``; accepts a tensor or anything array-like. Never unpickles."""
    arr = (value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)).astype(np.uint8, copy=False).ravel()
    if arr.size < 8:
        raise IntegrationError("zephon: the checkpoint's loader state slot is truncated")
    n = int.from_bytes(arr[:8].tobytes(), "little")
    if n <= 0 or 8 + n > arr.size:
        raise IntegrationError(f"zephon: the checkpoint's loader state slot is corrupt (length {n} in a slot of {arr.size} bytes)")
    try:
        state = json.loads(arr[8 : 8 + n].tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IntegrationError(f"zephon: the checkpoint's loader state is not valid JSON ({e})") from None
    if not isinstance(state, dict):
        raise IntegrationError("zephon: the checkpoint's loader state is not a JSON object")
    return state
