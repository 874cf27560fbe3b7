"""The dataset provider: which ranks load, with which identity, from which state.

Which ranks build a Pipeline: tensor-parallel rank 0 of the first and of the
last pipeline stage (of every stage when the batches carry per-document
sequence information, ``--dataloader-inter-document-masking``), on **every**
context-parallel rank, as Megatron's own GPT datasets are built. Other
tensor-parallel ranks receive each micro-batch by broadcast; each
context-parallel rank then keeps its slice of the sequence
(``get_batch_on_this_cp_rank``). All Pipelines of one data-parallel rank
(first and last stage, every context-parallel peer) have the same data
identity and read identical streams.

Identities: exactly one Pipeline per data-parallel rank takes part in a
checkpoint — tensor-parallel rank 0 of the first stage with context-parallel
rank 0 — so ``dp_degree = world_size = DP size`` and ``dp_group_id =
global_rank = DP rank``; the others never coordinate (``world_size = 1``) and
hand Megatron's checkpoint hook no state.

Virtual pipeline parallelism: Megatron calls the provider once per model chunk
(``vp_stage``). The first call builds the rank's one ``TrainStream``; each
chunk that consumes data (the first chunk of the first stage, the last chunk
of the last stage) gets its own reader of it, the others None.

The provider is marked ``is_distributed`` so Megatron calls it on every rank: every rank runs the same start-up
checks, reads the resumed loader state and works out the steps to skip (``zephon_megatron.surgery``), so a
refusal stops all ranks alike instead of leaving some waiting in a collective.

``--zephon-log-metrics``: global rank 0 takes the figures of its Pipeline every ``--log-interval`` and the
last rank, which holds Megatron's writers, writes them (``zephon_megatron.metrics``).

In-process restart (``--inprocess-restart``): Megatron runs ``pretrain()`` again in
the same process. The rank's loader of the failed attempt is closed (its Pipelines'
threads stopped) by Megatron's restart finalize (``plugin.wrap_destroy_global_state``)
or, failing that, when the provider builds the next one; the new one resumes from
the loader state of the checkpoint Megatron reloads, as any resume does.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zephon_core import Pipeline, owned_lanes
from zephon_core.integration import (
    Asked,
    Facts,
    Mixing,
    MixingLoader,
    Recipe,
    StartupPlan,
    lanes_line,
    restored_line,
    startup_line,
    startup_plan,
)
from zephon_megatron import state as loader_state
from zephon_megatron.args import Settings
from zephon_megatron.batches import BatchFormat
from zephon_megatron.iterators import TrainStream, ZephonTrainIterator, ZephonValidIterator, ZephonValidSet
from zephon_megatron.metrics import MegatronMetrics, megatron_writers
from zephon_megatron.schedule import BatchSchedule, StepCounter, Steps
from zephon_megatron.source_loss import MegatronSourceLoss
from zephon_megatron.steering import mixing_of
from zephon_megatron.surgery import StartupSurgery, journal_in, skips_at_start
from zephon_megatron.tokenizer import TokenizerAdapter, tokenizer_eod
from zephon_megatron.validate import ZephonMegatronError, check_run

#: Set by the entry point: True when the training script's get_batch uses
#: Megatron's get_batch_on_this_tp_rank (zephon_megatron.launch), False for
#: zephon_megatron.pretrain_gpt (its own broadcast).
ROUTE = {"megatron_broadcast": True}


def plan_of(args: Any, settings: Settings, steps: Steps) -> StartupPlan:
    """The run's start-up plan from Megatron's facts: the recipes loaded once, the lanes resolved once (resuming,
    they may come from the loader state, which the provider reads later: ``StartupPlan.resumed``)."""
    dp, mbs = int(args.data_parallel_size), int(args.micro_batch_size)
    runs = steps.runs if len(steps.runs) > 1 else ()
    gbs = runs[0][2] if runs else int(args.global_batch_size)
    whole = not any(g % mbs for _, _, g in runs)  # else validate names the global batch that is not (no rule here)
    facts = Facts(
        dp_degree=dp, world_size=dp, step_varies=steps.ramps,
        batches_per_step=max(1, gbs // max(1, mbs * dp)) * dp if whole else None,
        step_runs=tuple((first, last, g // mbs) for first, last, g in runs) if whole else (),
        rows_per_step=None if steps.ramps else steps.first_global_batch,
        seq_len=getattr(args, "seq_length", None), micro_batch_size=mbs,
        tp=int(getattr(args, "tensor_model_parallel_size", 1) or 1),
        pp=int(getattr(args, "pipeline_model_parallel_size", 1) or 1),
        cp=int(getattr(args, "context_parallel_size", 1) or 1),
    )
    asked = Asked(settings.canonical_replicas, settings.aggregate_dir, settings.run_id)
    return startup_plan(settings.recipe, facts, asked, framework="Megatron", role="--zephon-recipe",
                        held_out=settings.valid_recipes, held_out_role="--zephon-valid-recipe",
                        resuming=bool(getattr(args, "load", None)), error=ZephonMegatronError)


def _print_rank0(msg: str) -> None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
        print(msg, flush=True)


def _name_validation_sets(args: Any, settings: Settings) -> None:
    """With several held-out recipes and no --validation-set-names, Megatron's losses are named after the recipes."""
    if not getattr(args, "multiple_validation_sets", False) or getattr(args, "validation_set_names", None):
        return
    names = [os.path.splitext(os.path.basename(p))[0] for p in settings.valid_recipes]
    if names and len(set(names)) == len(names):
        args.validation_set_names = names


def prepare(args: Any) -> bool:
    """Map ``zephon`` to ``external`` and run the checks possible from the arguments alone.

    Called at ``pretrain()`` entry, on every rank; the provider repeats the
    full checks once the lane count and the micro-batch count are final.
    Returns False (and does nothing) when Zephon is not selected.
    """
    return _prepared(args) is not None


def _prepared(args: Any) -> StartupPlan | None:
    """Settings -> plan -> refuse: the plan of a run that may start (None: Zephon is not selected)."""
    settings = Settings.selected(args)
    if settings is None:
        return None
    steps = Steps.of(args)
    plan = plan_of(args, settings, steps)
    check_run(args, plan, steps, megatron_broadcast=ROUTE["megatron_broadcast"])
    _name_validation_sets(args, settings)
    if getattr(args, "rampup_batch_size", None) and not steps.ramps:
        _print_rank0("zephon: note: this megatron-core ignores --rampup-batch-size (deprecated since 0.18): the run "
                     f"trains at a constant global batch of {steps.first_global_batch}; "
                     "a ramp is --step-batch-size-schedule")
    return plan


@dataclass(frozen=True)
class Place:
    """Where this rank sits in Megatron's process grid, as far as loading is concerned."""

    tp_rank: int
    cp_rank: int
    dp: int
    dp_rank: int
    pp: int
    first: bool  # first pipeline stage (physical)
    last: bool
    all_stages: bool  # every stage needs the batches (--dataloader-inter-document-masking)

    @classmethod
    def from_mpu(cls, args: Any) -> Place:
        from megatron.core import mpu

        return cls(
            tp_rank=mpu.get_tensor_model_parallel_rank(),
            cp_rank=mpu.get_context_parallel_rank(),
            dp=mpu.get_data_parallel_world_size(),
            dp_rank=mpu.get_data_parallel_rank(),
            pp=mpu.get_pipeline_model_parallel_world_size(),
            first=mpu.is_pipeline_first_stage(ignore_virtual=True),
            last=mpu.is_pipeline_last_stage(ignore_virtual=True),
            all_stages=bool(getattr(args, "dataloader_inter_document_masking", False)),
        )

    @property
    def loads(self) -> bool:
        return self.tp_rank == 0 and (self.first or self.last or self.all_stages)

    @property
    def saves(self) -> bool:
        """The one Pipeline of this data-parallel rank that takes part in checkpoints."""
        return self.tp_rank == 0 and self.first and self.cp_rank == 0


def chunk_reads(place: Place, vp_stage: int | None) -> bool:
    """Whether model chunk ``vp_stage`` of this rank reads micro-batches (what Megatron's get_batch does)."""
    if not place.loads:
        return False
    if place.all_stages or vp_stage is None:
        return True
    from megatron.core import mpu

    return (mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
            or mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage))


def _resume(args: Any, settings: Settings, place: Place, schedule: BatchSchedule) -> loader_state.LoaderState | None:
    iteration = int(getattr(args, "iteration", 0) or 0)
    if iteration <= 0:
        return None
    consumed = int(getattr(args, "consumed_train_samples", 0) or 0)
    resumed = loader_state.load_for_iteration(
        settings.dataloader_save, iteration, place.dp_rank, batches_per_step=schedule.micro_batches(consumed),
        pipeline_parallel=place.pp > 1, delivered=consumed // schedule.micro_batch_size, consumed_samples=consumed)
    newer = [i for i in loader_state.saved_iterations(settings.dataloader_save or "") if i > iteration]
    if newer:
        _print_rank0(f"zephon: resuming at iteration {iteration}; ignoring loader states of later iterations {newer} "
                     "(their model checkpoints were not the ones loaded)")
    return resumed


def _tokenizer(args: Any, recipe: Recipe, settings: Settings) -> tuple[TokenizerAdapter | None, int | None]:
    tokenizer = None
    try:
        from megatron.training import get_tokenizer

        tokenizer = get_tokenizer()
    except Exception:  # no tokenizer built (e.g. --tokenizer-type not given)
        tokenizer = None
    eod = tokenizer_eod(tokenizer) if tokenizer is not None else None
    if not recipe.pretokenized and tokenizer is None:
        raise ZephonMegatronError(f"zephon: {settings.recipe} has text sources, which need Megatron's tokenizer (--tokenizer-type ...)")
    if getattr(args, "eod_mask_loss", False) and eod is None:
        raise ZephonMegatronError("zephon: --eod-mask-loss needs the tokenizer's end-of-document id; set --tokenizer-type")
    return (TokenizerAdapter(tokenizer) if not recipe.pretokenized else None), eod


class _Length:
    """What a rank that never evaluates hands Megatron for a full validation set: only a length (it is never read)."""

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Any:
        raise RuntimeError("zephon: a rank that does not load read a validation set")


class RankLoader:
    """Everything this rank serves Megatron in one run: the training stream and the held-out sets."""

    def __init__(self, args: Any, settings: Settings, place: Place, plan: StartupPlan) -> None:
        self.args = args
        self.place = place
        self.settings = settings
        self.stream: TrainStream | None = None
        self._valid_sets: list[ZephonValidSet] | None = None
        self._valid_iterators: list[ZephonValidIterator] = []
        schedule = BatchSchedule.from_megatron(args)
        resumed = _resume(args, settings, place, schedule)
        # Only the saving Pipeline of each data-parallel rank checkpoints with the others.
        self.plan = plan.resumed(resumed.state if resumed is not None else None).placed(
            dp_degree=place.dp, dp_rank=place.dp_rank, world_size=place.dp if place.saves else 1,
            global_rank=place.dp_rank)
        check_run(args, self.plan, Steps.of(args, schedule), megatron_broadcast=ROUTE["megatron_broadcast"])
        self._announce(resumed)
        surgery = skips_at_start(args, self.plan.recipe.surgery(), resumed.state if resumed else None,
                                 ramps=schedule.ramps, canonical_replicas=self.plan.canonical_replicas or place.dp)
        self.tok, self.eod = (None, None)
        if place.tp_rank == 0:
            self.tok, self.eod = _tokenizer(args, self.plan.recipe, settings)
        self.fmt = BatchFormat.from_args(args, self.eod)
        mixing = mixing_of(settings, self.plan.recipe)  # refused here on every rank, not on the loading ones alone
        if place.loads:
            self.stream = self._stream(schedule, resumed, mixing, surgery)
        self.metrics = MegatronMetrics.set_up(args, self.stream) if settings.log_metrics else None
        self.source_loss = per_source_loss(args, self.plan.recipe) if settings.source_loss else None

    def _announce(self, resumed: loader_state.LoaderState | None) -> None:
        """The start-up line and, resuming, where the loader state stood (rank 0); each rank's lanes at debug."""
        _print_rank0(startup_line(self.plan, "Megatron"))
        if resumed is not None:
            _print_rank0(restored_line(resumed.state, dp_degree=self.place.dp, batches_per_step=None,
                                       step=int(getattr(self.args, "iteration", 0) or 0)))
        if self.place.loads:
            lanes = owned_lanes(int(self.plan.canonical_replicas or self.place.dp), self.place.dp, self.place.dp_rank)
            import torch.distributed as dist

            rank = dist.get_rank() if dist.is_initialized() else 0
            logging.getLogger("zephon_megatron").debug(lanes_line(rank, self.place.dp_rank, lanes))

    def _stream(self, schedule: BatchSchedule, resumed: loader_state.LoaderState | None,
                mixing: Mixing | None, surgery: StartupSurgery) -> TrainStream:
        place, args, plan = self.place, self.args, self.plan
        built = plan.recipe.build(seq_len=args.seq_length, batch_size=args.micro_batch_size, tokenizer=self.tok,
                                  bos_id=None, eos_id=self.eod if self.tok is not None else None,
                                  global_batch_size=plan.stage_rows, **plan.options())
        # Under --zephon-mixing a resume replays the state's journal (MixingLoader.restore).
        pipeline = MixingLoader(built, mixing) if mixing is not None else built
        if resumed is not None:
            pipeline.restore(resumed.state)
        for line in journal_in(pipeline.pipeline if isinstance(pipeline, MixingLoader) else pipeline, surgery):
            _print_rank0(line)
        counter = StepCounter(schedule, place.dp, iteration=int(getattr(args, "iteration", 0) or 0),
                              consumed_samples=int(getattr(args, "consumed_train_samples", 0) or 0))
        return TrainStream(pipeline, self.fmt, counter, saves=place.saves)

    def train_for(self, vp_stage: int | None) -> ZephonTrainIterator | None:
        if self.stream is None or not chunk_reads(self.place, vp_stage):
            return None
        return self.stream.reader()

    def _held_out(self, i: int, batch_size: int) -> Callable[[], Pipeline]:
        held_out = self.plan.held_out[i]
        place, args, tok, eod = self.place, self.args, self.tok, self.eod

        def make() -> Pipeline:
            return held_out.recipe.build(seq_len=args.seq_length, batch_size=batch_size, tokenizer=tok, bos_id=None,
                                         eos_id=eod if tok is not None else None, dp_degree=place.dp,
                                         dp_group_id=place.dp_rank, canonical_replicas=held_out.canonical_replicas)

        return make

    def valid_for(self, vp_stage: int | None) -> Any:
        args, paths = self.args, self.settings.valid_recipes
        full = bool(getattr(args, "full_validation", False))
        if not paths or not (full or int(getattr(args, "eval_iters", 0) or 0) > 0):
            return None
        eval_mbs = int(getattr(args, "eval_micro_batch_size", None) or args.micro_batch_size)
        eval_gbs = int(getattr(args, "eval_global_batch_size", None) or args.global_batch_size)
        per_iteration = max(1, eval_gbs // (eval_mbs * self.place.dp))
        if full:
            sets = self._full_sets(paths, eval_mbs, per_iteration)
            return sets if getattr(args, "multiple_validation_sets", False) else sets[0]
        if not chunk_reads(self.place, vp_stage):
            return None
        valid = ZephonValidIterator(self._held_out(0, eval_mbs), self.fmt, int(args.eval_iters) * per_iteration)
        self._valid_iterators.append(valid)
        return valid

    def _full_sets(self, paths: tuple[str, ...], eval_mbs: int, per_iteration: int) -> list[Any]:
        # Megatron needs a length on every rank (it all-reduces it, then broadcasts rank 0's
        # before each evaluation), for every model chunk; only loading ranks ever read.
        if self.place.tp_rank != 0:
            return [_Length() for _ in paths]
        if self._valid_sets is None:
            args = self.args

            def eval_iters(i: int) -> Callable[[], int]:
                return lambda: int(args.eval_iters[i] if isinstance(args.eval_iters, (list, tuple)) else args.eval_iters)

            self._valid_sets = [ZephonValidSet(self._held_out(i, eval_mbs), self.fmt, per_iteration,
                                               eval_iters=eval_iters(i), name=p) for i, p in enumerate(paths)]
        return list(self._valid_sets)

    def close(self) -> None:
        """Stop this rank's Pipelines (the training stream's and the held-out iterators'); the loader is done."""
        if self.stream is not None:
            self.stream.close()
        for valid in self._valid_iterators:
            valid.close()


_CURRENT: dict[str, Any] = {"args": None, "loader": None}


def close_current() -> None:
    """Close this rank's loader, if any, and forget it (an in-process restart's finalize; the next build)."""
    loader: RankLoader | None = _CURRENT["loader"]
    _CURRENT["loader"] = _CURRENT["args"] = None
    if loader is not None:
        loader.close()


def provide(args: Any, vp_stage: int | None = None) -> tuple[Any, Any, Any]:
    """This rank's train and validation iterators (or Nones) for model chunk ``vp_stage``.

    A new build (model chunk 0, or another run's arguments) first closes the loader of an
    earlier ``pretrain()`` in this process, e.g. the attempt an in-process restart abandoned.
    """
    if vp_stage in (None, 0) or _CURRENT["args"] is not args or _CURRENT["loader"] is None:
        plan = _prepared(args)
        close_current()
        settings = Settings.from_args(args)
        plan = plan or plan_of(args, settings, Steps.of(args))
        _CURRENT["loader"] = RankLoader(args, settings, Place.from_mpu(args), plan)
        _CURRENT["args"] = args
    loader: RankLoader = _CURRENT["loader"]
    return loader.train_for(vp_stage), loader.valid_for(vp_stage), None


def per_source_loss(args: Any, recipe: Any) -> MegatronSourceLoss:
    """This rank's per-source loss (``--zephon-source-loss``): every rank reduces, the last one writes."""
    import torch.distributed as dist

    if ROUTE["megatron_broadcast"]:
        raise ZephonMegatronError("zephon: --zephon-source-loss needs the wheel entry "
                                  "(-m zephon_megatron.pretrain_gpt), whose loss function adds the losses per source; "
                                  "remove it on this route")
    if int(getattr(args, "context_parallel_size", 1) or 1) > 1:
        raise ZephonMegatronError("zephon: --zephon-source-loss does not support context parallelism; "
                                  "remove it or --context-parallel-size")

    last = not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == dist.get_world_size() - 1
    first_stage_shows = dist.is_available() and dist.is_initialized() and dist.get_rank() == 0 \
        and int(getattr(args, "pipeline_model_parallel_size", 1) or 1) > 1
    return MegatronSourceLoss(tuple(s.name for s in recipe.sources()), log_interval=int(args.log_interval or 1),
                              writes=last, writers=megatron_writers, shows_received=first_stage_shows)


def current_source_loss() -> MegatronSourceLoss | None:
    """This rank's per-source loss (None: none, or ``--zephon-source-loss`` is off)."""
    loader: RankLoader | None = _CURRENT["loader"]
    return loader.source_loss if loader is not None else None


def current_stream() -> TrainStream | None:
    """This rank's training stream (None: it loads no training micro-batches)."""
    loader: RankLoader | None = _CURRENT["loader"]
    return loader.stream if loader is not None else None


def current_metrics() -> MegatronMetrics | None:
    """This rank's part in logging Zephon's figures (None: none, or ``--zephon-log-metrics`` is off)."""
    loader: RankLoader | None = _CURRENT["loader"]
    return loader.metrics if loader is not None else None


def train_valid_test_datasets_provider(train_val_test_num_samples: Any, vp_stage: int | None = None) -> tuple[Any, Any, Any]:
    """Megatron's dataset provider for Zephon (the sample counts are not needed: the stream is endless)."""
    from megatron.training import get_args

    return provide(get_args(), vp_stage)


train_valid_test_datasets_provider.is_distributed = True  # type: ignore[attr-defined]
