"""GPT pretraining with Zephon for megatron-core wheel users (no Megatron-LM checkout).

    torchrun --nproc-per-node 8 -m zephon_megatron.pretrain_gpt \\
        --zephon-recipe configs/data/mg_train.toml --dataloader-save /ckpt/loader \\
        <the usual Megatron GPT flags>

The wheel ships ``megatron.training`` but not ``pretrain_gpt.py``: this module
brings its own ``forward_step`` / ``get_batch`` / ``loss_func`` and builds the
model from the arguments (``gpt_config_from_args``). ``--dataloader-type``
defaults to ``zephon`` here. ``get_batch`` moves each micro-batch from
tensor-parallel rank 0 to its peers with the adapter's own broadcast, which
works on gloo (CPU) and NCCL (GPU) alike, then keeps this context-parallel
rank's slice with Megatron's ``get_batch_on_this_cp_rank`` (what Megatron's
``pretrain_gpt.py`` does); with virtual pipelines only the model chunks that
hold the embedding or the loss read.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

from zephon_megatron.plugin import install

_KEYS = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids", "zephon_sources")
_AUDIT: dict[str, Any] = {"received": None}


def _received() -> Any:
    """This rank's log of the micro-batches it receives (``iterators.received_log``), opened at the first one."""
    if _AUDIT["received"] is None:
        from zephon_megatron.iterators import received_log

        _AUDIT["received"] = received_log()
    return _AUDIT["received"]


def _model_device() -> Any:
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reads_data(vp_stage: int | None) -> bool:
    """Whether this model chunk needs micro-batches: the first chunk of the first stage, the last of the last."""
    from megatron.core import mpu

    ignore_virtual = vp_stage is None
    return (mpu.is_pipeline_first_stage(ignore_virtual=ignore_virtual, vp_stage=vp_stage)
            or mpu.is_pipeline_last_stage(ignore_virtual=ignore_virtual, vp_stage=vp_stage))


def this_cp_rank_slice(batch: dict[str, Any]) -> dict[str, Any]:
    """Megatron's own split of a micro-batch along the sequence for this context-parallel rank (per-sequence zigzag)."""
    import inspect

    from megatron.core import mpu
    from megatron.core.utils import get_batch_on_this_cp_rank

    wanted = dict(is_hybrid_cp=False, cp_group=mpu.get_context_parallel_group(), use_per_sequence_balancing=True)
    params = inspect.signature(get_batch_on_this_cp_rank).parameters
    return get_batch_on_this_cp_rank(batch, **{k: v for k, v in wanted.items() if k in params})


def get_batch(data_iterator: Any, vp_stage: int | None = None) -> dict[str, Any]:
    """This rank's micro-batch: read on tensor-parallel rank 0, broadcast to its peers, cut to this CP rank's slice."""
    from megatron.core import mpu

    from zephon_megatron.broadcast import broadcast_microbatch

    if not reads_data(vp_stage):
        return {k: None for k in _KEYS}
    tp_rank = mpu.get_tensor_model_parallel_rank()
    batch = next(data_iterator) if tp_rank == 0 else None
    if mpu.get_tensor_model_parallel_world_size() > 1:
        received = _received()
        batch = broadcast_microbatch(batch, src=mpu.get_tensor_model_parallel_src_rank(),
                                     group=mpu.get_tensor_model_parallel_group(), verify=received.log is not None)
        if tp_rank != 0:
            batch = next(received.over([batch]))  # rank 0 logged it when it read it
    assert batch is not None
    device = _model_device()
    out = {k: (v.to(device, non_blocking=True) if v is not None else None) for k, v in dict.items(batch)}
    if mpu.get_context_parallel_world_size() > 1:
        out = this_cp_rank_slice(out)
    return out


def _vp_stage(model: Any) -> int | None:
    from megatron.core.utils import get_attr_wrapped_model

    try:
        return get_attr_wrapped_model(model, "vp_stage")
    except (RuntimeError, AttributeError):  # a model without virtual pipeline stages
        return None


def loss_func(loss_mask: Any, output_tensor: Any, sources: Any = None) -> tuple[Any, Any, dict[str, Any]]:
    """Token-summed loss, the number of counted tokens, and the pair for logging; with ``sources`` (the label
    source ids, ``--zephon-source-loss``) a training call also adds each counted label's loss to its source."""
    import torch

    if sources is not None and torch.is_grad_enabled() and output_tensor.requires_grad:
        from zephon_megatron.loader import current_source_loss

        tally = current_source_loss()
        if tally is not None:
            tally.add(output_tensor, loss_mask, sources)
    per_token = output_tensor.float().reshape(-1)
    weights = loss_mask.float().reshape(-1)
    total = (per_token * weights).sum()
    tokens = weights.sum().to(torch.int)
    return total, tokens, {"lm loss": torch.stack([total.detach(), tokens.detach().float()])}


def forward_step(data_iterator: Any, model: Any, return_schedule_plan: bool = False) -> tuple[Any, Any]:
    if return_schedule_plan:
        raise NotImplementedError("zephon_megatron.pretrain_gpt does not build schedule plans (--overlap-moe-expert-parallel-comm)")
    from megatron.training import get_timers

    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    batch = get_batch(data_iterator, _vp_stage(model))
    timers("batch-generator").stop()
    output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
    return output, partial(loss_func, batch["loss_mask"], sources=batch.get("zephon_sources"))


def main(argv: list[str] | None = None) -> None:
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    install()
    from zephon_megatron import loader

    loader.ROUTE["megatron_broadcast"] = False

    from megatron.core.enums import ModelType
    from megatron.training import pretrain
    from megatron.training.argument_utils import gpt_config_from_args, pretrain_cfg_container_from_args
    from megatron.training.arguments import parse_and_validate_args

    args = parse_and_validate_args(args_defaults={"dataloader_type": "zephon"})
    if args.dataloader_type != "zephon":
        raise SystemExit(f"zephon_megatron.pretrain_gpt trains from a Zephon recipe; remove --dataloader-type {args.dataloader_type}")
    cfg = pretrain_cfg_container_from_args(args, model_cfg=gpt_config_from_args(args))
    pretrain(cfg, loader.train_valid_test_datasets_provider, ModelType.encoder_or_decoder, forward_step)


if __name__ == "__main__":
    main()
