"""Stand-in for a Megatron-LM checkout's ``pretrain_gpt.py`` (test only).

Written in the shape of the checkout's script for megatron-core >= 0.18: it
parses the arguments itself, passes *its own* dataset provider, model
provider and ``forward_step`` to ``pretrain()``, and its ``get_batch`` reads a
micro-batch on tensor-parallel rank 0 and hands it to Megatron's
``get_batch_on_this_tp_rank`` for the broadcast. It knows nothing about
Zephon: run it as ``python -m zephon_megatron.launch pretrain_tiny_gpt.py
--dataloader-type zephon ...`` and the launcher swaps its provider for
Zephon's (this script's own provider refuses to run, which proves the swap).

The model is megatron.core's ``GPTModel`` with the local layer spec (no
TransformerEngine), small enough for CPU tests. On CPU it needs the test
shim, which ``cpu_entry.py`` applies before this script is executed.
"""

from __future__ import annotations

from functools import partial

import torch
from megatron.core import mpu
from megatron.core.enums import ModelType
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.utils import get_attr_wrapped_model, get_batch_on_this_cp_rank, get_batch_on_this_tp_rank
from megatron.training import get_args, pretrain
from megatron.training.argument_utils import core_transformer_config_from_args, pretrain_cfg_container_from_args
from megatron.training.arguments import parse_and_validate_args

_KEYS = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    """The script's own GPT dataset provider (a real checkout builds GPTDatasets here)."""
    raise RuntimeError("the stand-in script's own dataset provider was called: Zephon's provider did not replace it")


train_valid_test_datasets_provider.is_distributed = True


def model_provider(pre_process=True, post_process=True, config=None, pg_collection=None, vp_stage=None):
    args = get_args()
    if config is None:
        config = core_transformer_config_from_args(args)
    extra = {"pg_collection": pg_collection} if pg_collection is not None else {}
    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        vp_stage=vp_stage,
        **extra,
    )


def get_batch(data_iterator, vp_stage=None):
    # As megatron-core 0.19's pretrain_gpt.py: only the model chunks holding the embedding or
    # the loss read; tensor-parallel rank 0 reads and broadcasts; each context-parallel rank
    # keeps its slice of the sequence.
    args = get_args()
    ignore_virtual = vp_stage is None
    first = mpu.is_pipeline_first_stage(ignore_virtual=ignore_virtual, vp_stage=vp_stage)
    last = mpu.is_pipeline_last_stage(ignore_virtual=ignore_virtual, vp_stage=vp_stage)
    if not (first or last):
        return {k: None for k in _KEYS}
    tp_rank = mpu.get_tensor_model_parallel_rank()
    batch = {}
    if tp_rank == 0:
        raw = next(data_iterator)
        batch = {k: (raw[k].cuda(non_blocking=True) if raw.get(k) is not None else None) for k in _KEYS}
    batch = get_batch_on_this_tp_rank(
        batch,
        has_cu_seqlens=False,
        is_hybrid_cp=False,
        create_attention_mask_in_dataloader=args.create_attention_mask_in_dataloader,
        broadcast_src_rank=mpu.get_tensor_model_parallel_src_rank(),
        broadcast_group=mpu.get_tensor_model_parallel_group(),
        cp_size=args.context_parallel_size,
        tp_rank=tp_rank,
        micro_batch_size=args.micro_batch_size,
        seq_length=args.seq_length,
        mtp_on_this_rank=False,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        is_pipeline_first_stage=mpu.is_pipeline_first_stage(),
        is_pipeline_last_stage=mpu.is_pipeline_last_stage(),
    )
    batch = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False, cp_group=mpu.get_context_parallel_group())
    return {k: batch.get(k) for k in _KEYS}


def loss_func(loss_mask, output_tensor):
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().to(torch.int)
    return loss, num_tokens, {"lm loss": torch.cat([loss.detach().view(1), num_tokens.view(1).float()])}


def forward_step(data_iterator, model, return_schedule_plan: bool = False):
    batch = get_batch(data_iterator, get_attr_wrapped_model(model, "vp_stage"))
    output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
    return output, partial(loss_func, batch["loss_mask"])


if __name__ == "__main__":
    args = parse_and_validate_args()
    cfg = pretrain_cfg_container_from_args(args)
    pretrain(cfg, train_valid_test_datasets_provider, ModelType.encoder_or_decoder, forward_step, model_provider=model_provider)
