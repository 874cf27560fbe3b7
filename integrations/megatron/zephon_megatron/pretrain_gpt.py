"""GPT pretraining with Zephon for megatron-core wheel users (no Megatron-LM checkout).

    torchrun --nproc-per-node 8 -m zephon_megatron.pretrain_gpt \\
        --zephon-recipe configs/data/mg_train.toml --dataloader-save /ckpt/loader \\
        <the usual Megatron GPT flags>

The wheel ships ``megatron.training`` but not ``pretrain_gpt.py``: this module
brings its own ``forward_step`` / ``get_batch`` / ``loss_func`` and builds the
model from the arguments (``gpt_config_from_args``). ``--dataloader-type``
defaults to ``zephon`` here. ``get_batch`` moves each micro-batch from
tensor-parallel rank 0 to its peers with the adapter's own broadcast, which
works on gloo (CPU) and NCCL (GPU) alike.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

from zephon_megatron.plugin import install

_KEYS = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")
_AUDIT: dict[str, Any] = {"log": None, "opened": False}


def _audit_log() -> Any:
    if not _AUDIT["opened"]:
        from zephon_megatron.loader import open_batch_log

        _AUDIT["log"] = open_batch_log()
        _AUDIT["opened"] = True
    return _AUDIT["log"]


def _model_device() -> Any:
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def get_batch(data_iterator: Any) -> dict[str, Any]:
    """This rank's micro-batch: read on tensor-parallel rank 0, broadcast to its peers."""
    from megatron.core import mpu

    from zephon_megatron.broadcast import broadcast_microbatch

    first = mpu.is_pipeline_first_stage(ignore_virtual=True)
    last = mpu.is_pipeline_last_stage(ignore_virtual=True)
    if not (first or last):
        return {k: None for k in _KEYS}
    tp_rank = mpu.get_tensor_model_parallel_rank()
    batch = next(data_iterator) if tp_rank == 0 else None
    if mpu.get_tensor_model_parallel_world_size() > 1:
        log = _audit_log()
        batch = broadcast_microbatch(batch, src=mpu.get_tensor_model_parallel_src_rank(),
                                     group=mpu.get_tensor_model_parallel_group(), verify=log is not None)
        if tp_rank != 0 and log is not None and batch.meta is not None:
            log.write(batch.meta.line() + "\n")
    assert batch is not None
    device = _model_device()
    return {k: (v.to(device, non_blocking=True) if v is not None else None) for k, v in dict.items(batch)}


def loss_func(loss_mask: Any, output_tensor: Any) -> tuple[Any, Any, dict[str, Any]]:
    """Token-summed loss, the number of counted tokens, and the pair for logging."""
    import torch

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
    batch = get_batch(data_iterator)
    timers("batch-generator").stop()
    output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
    return output, partial(loss_func, batch["loss_mask"])


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
