"""Test-only core attention for packed sequences (THD, ``cu_seqlens``) on CPU.

megatron-core's local ``DotProductAttention`` refuses packed sequences
("Packed sequence is not supported by DotProductAttention. Please use
TEDotProductAttention instead."), and TransformerEngine needs CUDA. This
subclass turns the THD call into the one the local class does support: the
boundaries in ``packed_seq_params.cu_seqlens_q`` become a block-diagonal causal
mask over the packed tokens (what TE's and flash-attention's varlen kernels
compute: a token attends to the earlier tokens of its own sequence only), and
Megatron's own ``DotProductAttention.forward`` runs on the tokens as a batch of
one with that mask. Without packed-sequence parameters it is Megatron's class
unchanged. Import it only after ``shim.apply()`` (it imports megatron).
"""

from __future__ import annotations

import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention


def block_causal_mask(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """``[1, 1, t, t]`` bool, True where query ``i`` may NOT attend key ``j`` (Megatron's convention)."""
    tokens = torch.arange(total, device=cu_seqlens.device)
    sequence = torch.bucketize(tokens, cu_seqlens[1:].long(), right=True)
    blocked = (sequence[:, None] != sequence[None, :]) | (tokens[None, :] > tokens[:, None])
    return blocked[None, None]


class ThdDotProductAttention(DotProductAttention):
    """Megatron's local core attention, taking THD inputs ``[t, heads, head_dim]`` with ``cu_seqlens``."""

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if packed_seq_params is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias)
        assert packed_seq_params.qkv_format == "thd", packed_seq_params.qkv_format
        assert packed_seq_params.cu_seqlens_q_padded is None and packed_seq_params.cu_seqlens_kv_padded is None
        assert torch.equal(packed_seq_params.cu_seqlens_q, packed_seq_params.cu_seqlens_kv), "self-attention only"
        mask = block_causal_mask(packed_seq_params.cu_seqlens_q, query.shape[0])
        out = super().forward(query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1), mask, attn_mask_type,
                              attention_bias)
        return out.squeeze(1)  # [t, hidden], as TEDotProductAttention returns for THD
