"""Start-up validators: refuse, before the first step, runs Zephon cannot keep exact.

Every check works on plain values (``RunShape``), so it runs the same in unit
tests, at ``pretrain()`` entry on every rank, and again in the dataset
provider once the number of micro-batches and the lane count are final. Each
message says what to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zephon_core.integration import IntegrationError, Terms, Topology, next_multiple, refuse, topology_problems


class ZephonMegatronError(IntegrationError):
    """A Megatron run the Zephon adapter refuses to start, or a loader state it cannot use."""


@dataclass(frozen=True)
class RunShape:
    """The parts of a Megatron run that decide whether Zephon can serve it."""

    dp: int  # data-parallel size (without context parallelism)
    micro_batch_size: int
    global_batch_size: int
    num_microbatches: int  # per data-parallel rank and optimizer step
    canonical_replicas: int | None  # None: not known yet (checked later)
    tp: int = 1
    pp: int = 1
    cp: int = 1
    virtual_pp: int | None = None
    rampup_batch_size: Any = None
    eval_iters: int = 0
    eval_interval: int | None = 1000
    valid_recipe: str | None = None
    aggregate_dir: str | None = None
    run_id: str | None = None
    create_attention_mask: bool = True
    reset_attention_mask: bool = False
    inter_document_masking: bool = False
    sft: bool = False
    full_validation: bool = False
    save: str | None = None
    dataloader_save: str | None = None
    # True when the training script's own get_batch broadcasts with Megatron's
    # get_batch_on_this_tp_rank (zephon_megatron.launch); False for
    # zephon_megatron.pretrain_gpt, whose broadcast sends what the loader made.
    megatron_broadcast: bool = True

    @property
    def batches_per_step(self) -> int:
        """Micro-batches one optimizer step consumes over all data-parallel ranks (GBS / MBS)."""
        return self.num_microbatches * self.dp

    @classmethod
    def from_args(cls, args: Any, *, canonical_replicas: int | None, num_microbatches: int | None = None,
                  valid_recipe: str | None = None, aggregate_dir: str | None = None, run_id: str | None = None,
                  megatron_broadcast: bool = True) -> RunShape:
        dp = int(args.data_parallel_size)
        mbs = int(args.micro_batch_size)
        gbs = int(args.global_batch_size)
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
            rampup_batch_size=getattr(args, "rampup_batch_size", None),
            eval_iters=_eval_iters(args),
            eval_interval=getattr(args, "eval_interval", 1000),
            valid_recipe=valid_recipe,
            aggregate_dir=aggregate_dir,
            run_id=run_id,
            create_attention_mask=bool(getattr(args, "create_attention_mask_in_dataloader", True)),
            reset_attention_mask=bool(getattr(args, "reset_attention_mask", False)),
            inter_document_masking=bool(getattr(args, "dataloader_inter_document_masking", False)),
            sft=bool(getattr(args, "sft", False)),
            full_validation=bool(getattr(args, "full_validation", False)),
            save=getattr(args, "save", None),
            dataloader_save=getattr(args, "dataloader_save", None),
            megatron_broadcast=megatron_broadcast,
        )


def _eval_iters(args: Any) -> int:
    value = getattr(args, "eval_iters", 0) or 0
    if isinstance(value, (list, tuple)):
        return sum(int(v or 0) for v in value)
    return int(value)


def terms(s: RunShape) -> Terms:
    """Megatron's names for what the core's topology rules talk about."""
    return Terms(
        dp="data-parallel size",
        canonical_replicas="--zephon-canonical-replicas",
        aggregate_dir="--zephon-aggregate-dir",
        run_id="--zephon-run-id",
        step=lambda n: (f"num_microbatches x DP = {s.num_microbatches} x {s.dp} = {n} micro-batches (global batch "
                        f"{s.global_batch_size} / micro batch {s.micro_batch_size})"),
        step_fix=lambda C, n: (f"set --global-batch-size to a multiple of {C * s.micro_batch_size} "
                               f"(e.g. {next_multiple(n, C) * s.micro_batch_size})"),
    )


def problems(s: RunShape) -> list[str]:
    """Everything wrong with ``s``, one sentence each; empty when the run is fine."""
    topology = Topology(s.dp, s.canonical_replicas, s.batches_per_step, s.dp, s.aggregate_dir, s.run_id)
    out = topology_problems(topology, terms(s))
    if s.rampup_batch_size:
        out.append(
            "--rampup-batch-size changes the number of micro-batches per step during the run, so steps cannot keep the same "
            "samples; remove it (use a constant --global-batch-size)"
        )
    if s.virtual_pp is not None and s.virtual_pp > 1:
        out.append(
            "virtual pipeline parallelism is not supported (Megatron then keeps one data iterator per virtual stage and cannot "
            "save their state); remove --num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank"
        )
    if s.cp > 1:
        out.append(
            f"--context-parallel-size {s.cp} is not supported yet (context-parallel peers would each save the loader state); "
            "use --context-parallel-size 1"
        )
    if s.eval_iters > 0 and s.eval_interval is None:
        out.append(f"--eval-iters={s.eval_iters} needs --eval-interval N (steps between evaluations; megatron-core has no default)")
    if s.eval_iters > 0 and not s.valid_recipe:
        out.append(
            f"Megatron will evaluate --eval-iters={s.eval_iters} batches per evaluation, but no held-out data is given; pass "
            "--zephon-valid-recipe <held-out recipe .toml>, or --eval-iters 0"
        )
    if s.sft:
        out.append("--sft uses Megatron's SFT datasets and their batch format; Zephon serves pretraining batches only")
    if s.full_validation:
        out.append("--full-validation needs a validation set of known length; use --eval-iters with --zephon-valid-recipe")
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
    if s.save and not s.dataloader_save:
        out.append(
            "--save is set but --dataloader-save is not: checkpoints would lack the loader state and could not be resumed; "
            "pass --dataloader-save DIR (a shared folder, e.g. next to --save)"
        )
    return out


def check(s: RunShape) -> None:
    """Raise ``ZephonMegatronError`` listing every problem of ``s``."""
    refuse(problems(s), ZephonMegatronError)
