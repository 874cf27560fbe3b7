"""Test-only core attention with context parallelism over gloo (CPU).

megatron-core's local ``DotProductAttention`` refuses context parallelism
("only supported by TEDotProductAttention"), and TransformerEngine needs CUDA.
This module stands in for it when ``context_parallel_size > 1`` so that the
real ``pretrain()`` loop runs with CP on a CPU:

* each context-parallel rank holds the two sequence chunks Megatron's
  ``get_batch_on_this_cp_rank`` gave it (per-sequence zigzag: rank ``r`` of
  ``W`` has chunks ``r`` and ``2W - 1 - r`` of ``2W``);
* keys and values are all-gathered over the context-parallel group (gradients
  flow back through an all-reduce), so every rank attends its queries to the
  whole sequence;
* the causal mask is built from the global positions of the local queries and
  the gathered keys (a mask from the data loader, sliced on its query axis by
  Megatron, is used as it is, its key axis being the whole sequence).

With ``context_parallel_size == 1`` the class builds megatron-core's own
``DotProductAttention``, so runs without CP are unchanged. ``install()``
makes the local layer spec use it.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0; the gradient of each rank's part is the sum over ranks."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        ctx.n = x.shape[0]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.rank * ctx.n : (ctx.rank + 1) * ctx.n], None


def zigzag_positions(local_len: int, rank: int, world: int) -> torch.Tensor:
    """Global sequence positions of a CP rank's local rows (Megatron's per-sequence split)."""
    c = local_len // 2
    first = torch.arange(rank * c, (rank + 1) * c)
    second = torch.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c)
    return torch.cat([first, second])


def _megatron_attention():
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    return DotProductAttention


class ContextParallelAttention(torch.nn.Module):
    """Core attention over the whole sequence from context-parallel shards (test only)."""

    def __new__(cls, config, *args, **kwargs):
        if config.context_parallel_size == 1:
            return _megatron_attention()(config, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                 softmax_scale=None, cp_comm_type=None, pg_collection=None):
        super().__init__()
        from megatron.core import parallel_state

        self.config = config
        tp = parallel_state.get_tensor_model_parallel_world_size()
        self.heads = config.num_attention_heads // tp
        self.groups = config.num_query_groups // tp
        head_dim = config.kv_channels
        self.hidden = self.heads * head_dim
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        self.dropout = torch.nn.Dropout(config.attention_dropout if attention_dropout is None else attention_dropout)
        self.cp_group = parallel_state.get_context_parallel_group()

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        assert packed_seq_params is None and attention_bias is None, "the test CP attention has no THD / bias support"
        from megatron.core import tensor_parallel

        world, rank = dist.get_world_size(self.cp_group), dist.get_rank(self.cp_group)
        key = _GatherSequence.apply(key, self.cp_group)
        value = _GatherSequence.apply(value, self.cp_group)
        if self.heads > self.groups:
            key = key.repeat_interleave(self.heads // self.groups, dim=2)
            value = value.repeat_interleave(self.heads // self.groups, dim=2)
        sq = query.shape[0]
        q_pos = zigzag_positions(sq, rank, world)
        k_pos = torch.cat([zigzag_positions(sq, r, world) for r in range(world)])
        q = query.permute(1, 2, 0, 3).float()  # [b, np, sq, hn]
        k = key.permute(1, 2, 3, 0).float()  # [b, np, hn, sk]
        v = value.permute(1, 2, 0, 3).float()  # [b, np, sk, hn]
        scores = torch.matmul(q, k) * self.scale
        if attention_mask is not None:
            blocked = attention_mask.index_select(-1, k_pos.to(attention_mask.device))
        else:
            blocked = k_pos[None, :] > q_pos[:, None]
        scores = scores.masked_fill(blocked, -10000.0)
        probs = torch.softmax(scores, dim=-1)
        with tensor_parallel.get_cuda_rng_tracker().fork():
            probs = self.dropout(probs)
        context = torch.matmul(probs, v).to(query.dtype)  # [b, np, sq, hn]
        return context.permute(2, 0, 1, 3).reshape(sq, query.shape[1], self.hidden)


def install() -> None:
    """Make megatron-core's local layer spec use this attention (it defers to Megatron's own without CP)."""
    import megatron.core.models.backends as backends

    backends.DotProductAttention = ContextParallelAttention
