"""Start-up validators: refuse, before the first step, runs Zephon cannot keep exact.

The rules of the elastic guarantee (lanes, step size at every step of a schedule, aggregation) are the
start-up plan's (``StartupPlan.problems``), worded in Megatron's terms (``terms``); Megatron's own rules
(evaluation, masks, flags it does not read, a steered run's checkpoints only at logged iterations: ``save_clock``)
work on plain values (``RunShape``). ``check`` refuses both
at once, at ``pretrain()`` entry on every rank and again in the dataset provider once the lane count is
final. Each message says what to change.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zephon_core.integration import (
    IntegrationError,
    SaveClock,
    StartupPlan,
    Terms,
    next_multiple,
    refuse,
    unlogged_saves,
)

if TYPE_CHECKING:
    from zephon_megatron.schedule import Steps


class ZephonMegatronError(IntegrationError):
    """A Megatron run the Zephon adapter refuses to start, or a loader state it cannot use."""


@dataclass(frozen=True)
class RunShape:
    """The parts of a Megatron run that decide whether Zephon can serve it."""

    dp: int  # data-parallel size (without context parallelism)
    micro_batch_size: int
    global_batch_size: int
    num_microbatches: int  # per data-parallel rank and optimizer step (of the first step when the batch ramps)
    canonical_replicas: int | None  # None: not known yet
    tp: int = 1
    pp: int = 1
    cp: int = 1
    virtual_pp: int | None = None
    # The global-batch schedule as runs of equal steps (first, last, global batch); empty: constant.
    batch_steps: tuple[tuple[int, int, int], ...] = ()
    schedule_flag: str = "--global-batch-size"
    hybrid_cp: bool = False
    eval_iters: int = 0
    eval_interval: int | None = 1000
    valid_recipes: tuple[str, ...] = ()
    endless_valid_recipes: tuple[str, ...] = ()  # held-out recipes that never end (exhausted != "stop")
    full_validation: bool = False
    multiple_validation_sets: bool = False
    create_attention_mask: bool = True
    reset_attention_mask: bool = False
    inter_document_masking: bool = False
    sft: bool = False
    save: str | None = None
    dataloader_save: str | None = None
    # True when the training script's own get_batch broadcasts with Megatron's
    # get_batch_on_this_tp_rank (zephon_megatron.launch); False for
    # zephon_megatron.pretrain_gpt, whose broadcast sends what the loader made.
    megatron_broadcast: bool = True
    data_flags: tuple[str, ...] = ()  # Megatron's own data flags given (the recipe names the data instead)
    saves: SaveClock | None = None  # when a steered run (--zephon-mixing) logs and checkpoints; None: not steered

    @property
    def batches_per_step(self) -> int:
        """Micro-batches one optimizer step consumes over all data-parallel ranks (GBS / MBS; the first step's)."""
        return self.num_microbatches * self.dp

    @classmethod
    def from_args(cls, args: Any, *, canonical_replicas: int | None, num_microbatches: int | None = None,
                  batch_steps: tuple[tuple[int, int, int], ...] = (), valid_recipes: tuple[str, ...] = (),
                  endless_valid_recipes: tuple[str, ...] = (), megatron_broadcast: bool = True) -> RunShape:
        dp = int(args.data_parallel_size)
        mbs = int(args.micro_batch_size)
        gbs = int(batch_steps[0][2]) if batch_steps else int(args.global_batch_size)
        nmb = num_microbatches if num_microbatches is not None else max(1, gbs // max(1, mbs * dp))
        return cls(
            dp=dp,
            micro_batch_size=mbs,
            global_batch_size=gbs,
            num_microbatches=nmb,
            canonical_replicas=canonical_replicas,
            tp=int(getattr(args, "tensor_model_parallel_size", 1) or 1),
            pp=int(getattr(args, "pipeline_model_parallel_size", 1) or 1),
            cp=int(getattr(args, "context_parallel_size", 1) or 1),
            virtual_pp=getattr(args, "virtual_pipeline_model_parallel_size", None),
            batch_steps=batch_steps if len(batch_steps) > 1 else (),
            schedule_flag=_schedule_flag(args),
            hybrid_cp=bool(getattr(args, "hybrid_context_parallel", False)),
            eval_iters=_eval_iters(args),
            eval_interval=getattr(args, "eval_interval", 1000),
            valid_recipes=valid_recipes,
            endless_valid_recipes=endless_valid_recipes,
            full_validation=bool(getattr(args, "full_validation", False)),
            multiple_validation_sets=bool(getattr(args, "multiple_validation_sets", False)),
            create_attention_mask=bool(getattr(args, "create_attention_mask_in_dataloader", True)),
            reset_attention_mask=bool(getattr(args, "reset_attention_mask", False)),
            inter_document_masking=bool(getattr(args, "dataloader_inter_document_masking", False)),
            sft=bool(getattr(args, "sft", False)),
            save=getattr(args, "save", None),
            dataloader_save=getattr(args, "dataloader_save", None),
            megatron_broadcast=megatron_broadcast,
            data_flags=_data_flags(args),
            saves=save_clock(args, batch_steps, _schedule_flag(args)),
        )


# Megatron's flags that choose its own datasets; with --dataloader-type zephon the recipe does.
_DATA_FLAGS = ("data_path", "data_args_path", "per_split_data_args_path", "train_data_path", "valid_data_path",
               "test_data_path", "mock_data")


def _data_flags(args: Any) -> tuple[str, ...]:
    return tuple("--" + f.replace("_", "-") for f in _DATA_FLAGS if getattr(args, f, None) not in (None, False, [], ""))


def save_clock(args: Any, batch_steps: tuple[tuple[int, int, int], ...] = (),
               schedule_flag: str = "--global-batch-size") -> SaveClock | None:
    """When a steered run (``--zephon-mixing``) logs and checkpoints, in megatron-core 0.19's iterations (None:
    not steered, or no ``--save``). The adapter takes the per-source loss at every multiple of ``--log-interval``
    (``MegatronSourceLoss.at_iteration``, after ``training_log``); Megatron checkpoints after it at every multiple
    of ``--save-interval``, ``--non-persistent-save-interval`` and ``--exit-interval``, at each
    ``--phase-transition-iterations``, before a step whose global batch grows (a batch-size schedule) and at the
    end of training (``--train-iters``). A signal (``--exit-signal-handler``), ``--exit-duration-in-mins`` or the
    rerun state machine save wherever they happen: docs/mixing.md."""
    if not getattr(args, "zephon_mixing", False) or not getattr(args, "save", None):
        return None
    L = max(1, int(getattr(args, "log_interval", 100) or 1))
    every = tuple((flag, int(value)) for flag, value in (
        ("--save-interval", getattr(args, "save_interval", None)),
        ("--non-persistent-save-interval", getattr(args, "non_persistent_save_interval", None)),
        ("--exit-interval", getattr(args, "exit_interval", None))) if value)
    at: list[tuple[str, int, str]] = []
    iters, samples = getattr(args, "train_iters", None), getattr(args, "train_samples", None)
    if iters:
        flag = "--train-samples" if samples else "--train-iters"
        what = f"{flag} = {samples} ({iters} iterations)" if samples else f"{flag} = {iters}"
        at.append((f"{what}, at the end of training,", int(iters), f"set {flag} so that training ends at a multiple "
                   f"of --log-interval (e.g. {next_multiple(int(iters), L)} iterations)"))
    phases = getattr(args, "phase_transition_iterations", None) or ()
    for n in sorted(int(x) for x in (phases.split(",") if isinstance(phases, str) else phases)):
        at.append((f"--phase-transition-iterations {n}", n, "make every one a multiple of --log-interval"))
    grows = [last for _, last, _ in batch_steps[:-1]]
    at += [(f"{schedule_flag}, whose global batch changes after it,", n,
            f"set --log-interval to a divisor of every such iteration (e.g. {math.gcd(*grows)})") for n in grows]
    return SaveClock("--log-interval", L, every=every, at=tuple(at), last=int(iters) if iters else None,
                     step="iteration")


def _schedule_flag(args: Any) -> str:
    if getattr(args, "step_batch_size_schedule", None):
        return "--step-batch-size-schedule"
    if getattr(args, "rampup_batch_size", None):
        return "--rampup-batch-size"
    return "--global-batch-size"


def _eval_iters(args: Any) -> int:
    value = getattr(args, "eval_iters", 0) or 0
    if isinstance(value, (list, tuple)):
        return sum(int(v or 0) for v in value)
    return int(value)


def _where(steps: tuple[int, int]) -> str:
    return f"step {steps[0]}" if steps[0] == steps[1] else f"steps {steps[0]}-{steps[1]}"


def terms(s: RunShape, steps: tuple[int, int] | None = None) -> Terms:
    """Megatron's names for what the core's topology rules talk about (``steps``: the steps of a schedule concerned)."""
    mbs = s.micro_batch_size

    def step(n: int) -> str:
        if steps is None:
            return (f"num_microbatches x DP = {s.num_microbatches} x {s.dp} = {n} micro-batches (global batch "
                    f"{s.global_batch_size} / micro batch {mbs})")
        return f"at {_where(steps)} of the {s.schedule_flag} schedule {n} micro-batches (global batch {n * mbs} / micro batch {mbs})"

    def step_fix(C: int, n: int) -> str:
        if steps is None:
            return f"set --global-batch-size to a multiple of {C * mbs} (e.g. {next_multiple(n, C) * mbs})"
        return (f"make every global batch of {s.schedule_flag} a multiple of {C * mbs} "
                f"(e.g. {next_multiple(n, C) * mbs} at {_where(steps)})")

    return Terms(
        dp="data-parallel size",
        canonical_replicas="--zephon-canonical-replicas",
        aggregate_dir="--zephon-aggregate-dir",
        run_id="--zephon-run-id",
        step=step,
        step_fix=step_fix,
        at=(lambda first, last: terms(s, (first, last))) if s.batch_steps and steps is None else None,
    )


def _schedule(s: RunShape) -> list[str]:
    C, mbs = s.canonical_replicas, s.micro_batch_size
    for first, last, gbs in s.batch_steps:
        if gbs % mbs:
            return [f"{s.schedule_flag} gives a global batch of {gbs} at {_where((first, last))}, not a multiple of "
                    f"--micro-batch-size {mbs}; make every global batch of the schedule a multiple of {mbs * (C or 1)}"]
    return []


def _evaluation(s: RunShape) -> list[str]:
    out = []
    if s.eval_iters > 0 and s.eval_interval is None:
        out.append(f"--eval-iters={s.eval_iters} needs --eval-interval N (steps between evaluations; megatron-core has no default)")
    if (s.eval_iters > 0 or s.full_validation) and not s.valid_recipes:
        what = "--full-validation" if s.full_validation else f"--eval-iters={s.eval_iters} batches per evaluation"
        out.append(f"Megatron will evaluate ({what}), but no held-out data is given; pass --zephon-valid-recipe "
                   "<held-out recipe .toml>, or --eval-iters 0")
    if len(s.valid_recipes) > 1 and not (s.multiple_validation_sets and s.full_validation):
        out.append(
            f"{len(s.valid_recipes)} held-out recipes are given, one validation set each: megatron-core evaluates several "
            "validation sets only with --multiple-validation-sets --full-validation (each evaluation then reads every "
            "set to its end); add both flags, or pass one --zephon-valid-recipe"
        )
    elif s.multiple_validation_sets and not s.full_validation:
        out.append("--multiple-validation-sets needs --full-validation in megatron-core (it raises NotImplementedError "
                   "otherwise); add --full-validation")
    if s.full_validation and s.endless_valid_recipes:
        out.append(f"--full-validation reads each held-out recipe to its end, but {', '.join(s.endless_valid_recipes)} "
                   "never ends; set exhausted = \"stop\" in it (a held-out recipe is one pass over its data)")
    return out


def problems(s: RunShape) -> list[str]:
    """Everything wrong with ``s`` by Megatron's own rules, one sentence each; empty when the run is fine."""
    out = _schedule(s)
    if s.hybrid_cp:
        out.append(
            "--hybrid-context-parallel regroups sequences per micro-batch (local_cp_size); Zephon serves fixed-length packed "
            "rows: remove it (plain --context-parallel-size is supported)"
        )
    out += _evaluation(s)
    if s.data_flags:
        out.append(
            f"{', '.join(s.data_flags)}: Megatron's data flags are not read with --dataloader-type zephon, the recipe "
            "(--zephon-recipe) names the data; remove them (`zephon from-megatron --data-path ...` writes a recipe "
            "of the same blend)"
        )
    if s.sft:
        out.append("--sft uses Megatron's SFT datasets and their batch format; Zephon serves pretraining batches only")
    if s.reset_attention_mask and not s.create_attention_mask:
        out.append(
            "--reset-attention-mask needs the per-document attention mask from the loader, but "
            "--no-create-attention-mask-in-dataloader stops Megatron from passing it to the model; drop one of the two"
        )
    if s.inter_document_masking and not s.megatron_broadcast:
        out.append(
            "--dataloader-inter-document-masking: zephon_megatron.pretrain_gpt does not pass packed-sequence parameters to the "
            "model; use `python -m zephon_megatron.launch pretrain_gpt.py ...` with a script that does"
        )
    if (s.megatron_broadcast and s.tp > 1 and s.create_attention_mask and not s.reset_attention_mask
            and not s.inter_document_masking):
        out.append(
            f"with --tensor-model-parallel-size {s.tp}, Megatron's get_batch_on_this_tp_rank makes tensor-parallel ranks wait "
            "for an attention mask from the loader (create_attention_mask_in_dataloader is on by default), but the model "
            "builds the causal mask itself and Zephon sends none, so those ranks would hang forever; pass "
            "--no-create-attention-mask-in-dataloader (or --reset-attention-mask if you want per-document masks)"
        )
    out += unlogged_saves(s.saves) if s.saves is not None else []
    if s.save and not s.dataloader_save:
        out.append(
            "--save is set but --dataloader-save is not: checkpoints would lack the loader state and could not be resumed; "
            "pass --dataloader-save DIR (a shared folder, e.g. next to --save)"
        )
    return out


def launched_rank() -> int | None:
    """This process's global rank when torchrun started it among others (None: a process of its own); the
    checks at ``pretrain()`` entry run before Megatron initialises torch.distributed, so torchrun's variables."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() if dist.get_world_size() > 1 else None
    return int(os.environ["RANK"]) if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ else None


def check(s: RunShape, plan: StartupPlan | None = None) -> None:
    """Raise ``ZephonMegatronError`` listing every rule ``plan`` breaks (in Megatron's terms) and every problem
    of ``s`` (under torchrun: said once, by rank 0, and every rank ends with status 1 without a traceback)."""
    refuse((plan.problems(terms(s)) if plan is not None else []) + problems(s), ZephonMegatronError,
           rank=launched_rank())


def shape_of(args: Any, plan: StartupPlan, steps: Steps | None = None, *, megatron_broadcast: bool = True) -> RunShape:
    """Megatron's own start-up facts beside the plan's (lanes, held-out sets)."""
    full = bool(getattr(args, "full_validation", False))
    endless = tuple(h.path for h in plan.held_out if h.endless) if full else ()
    return RunShape.from_args(args, canonical_replicas=plan.canonical_replicas,
                              batch_steps=steps.runs if steps is not None else (),
                              valid_recipes=tuple(h.path for h in plan.held_out), endless_valid_recipes=endless,
                              megatron_broadcast=megatron_broadcast)


def check_run(args: Any, plan: StartupPlan, steps: Steps | None = None, *, megatron_broadcast: bool = True) -> None:
    """Refuse the run of ``args`` (as ``check``) unless ``plan`` and Megatron's own rules all hold."""
    check(shape_of(args, plan, steps, megatron_broadcast=megatron_broadcast), plan)
