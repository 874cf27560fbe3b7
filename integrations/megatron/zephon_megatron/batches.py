"""Zephon batches as Megatron GPT micro-batches.

A Zephon ``Batch`` holds rows of ``seq_length`` inputs, their next-token
labels, per-document positions and a label-validity mask. Megatron's GPT
``forward_step`` wants ``tokens``/``labels``/``position_ids`` (int64),
``loss_mask`` (float32) and, depending on the run, ``attention_mask`` (bool
``[b, 1, s, s]``, True = may not attend) or ``cu_seqlens``/``max_seqlen``.

Documents are Zephon's own (a row restarts its positions at every document
start, and a row's trailing padding counts as part of its last document), so
``--reset-position-ids`` and ``--reset-attention-mask`` follow true document
boundaries even for pretokenized data without end-of-document tokens; for data
whose documents end with the EOD token (text tokenized here, or Megatron
``preprocess_data.py --append-eod`` output) this is what Megatron's own
``GPTDataset`` does. ``--eod-mask-loss`` zeroes the loss where the *input*
token is the EOD token, as Megatron does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_core import Batch
from zephon_core.integration import label_sources

#: Keys of a micro-batch, in Megatron's order; absent pieces are None.
KEYS = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids", "cu_seqlens", "max_seqlen")


@dataclass(frozen=True)
class BatchFormat:
    """How this run wants its micro-batches (from Megatron's flags)."""

    eod_id: int | None = None
    eod_mask_loss: bool = False
    reset_position_ids: bool = False
    attention_mask: bool = False  # send a mask at all (only --reset-attention-mask needs one)
    reset_attention_mask: bool = False
    cu_seqlens: bool = False  # --dataloader-inter-document-masking
    source_ids: bool = False  # --zephon-source-loss: each label's source (``zephon_sources``)

    @classmethod
    def from_args(cls, args: Any, eod_id: int | None) -> BatchFormat:
        reset_mask = bool(getattr(args, "reset_attention_mask", False))
        return cls(
            eod_id=eod_id,
            eod_mask_loss=bool(getattr(args, "eod_mask_loss", False)),
            reset_position_ids=bool(getattr(args, "reset_position_ids", False)),
            attention_mask=reset_mask and bool(getattr(args, "create_attention_mask_in_dataloader", True)),
            reset_attention_mask=reset_mask,
            cu_seqlens=bool(getattr(args, "dataloader_inter_document_masking", False)),
            source_ids=bool(getattr(args, "zephon_source_loss", False)),
        )


def document_starts(batch: Batch) -> list[np.ndarray]:
    """Per row, the input positions where a document starts (always including 0).

    Padding at a row's end is folded into its last document.
    """
    L = batch.input_ids.shape[1]
    # Row r's packed width is L + 1 with a valid prefix of n tokens: labels are
    # valid for the first n - 1 inputs, inputs for the first min(n, L).
    n_inputs = np.minimum(batch.loss_mask.sum(axis=1).astype(np.int64) + 1, L)
    out = []
    for r in range(batch.input_ids.shape[0]):
        starts = np.flatnonzero(batch.positions[r, : n_inputs[r]] == 0)
        if starts.size == 0 or starts[0] != 0:
            starts = np.concatenate([[0], starts])
        out.append(starts.astype(np.int64))
    return out


def _segment_start_per_token(starts: np.ndarray, L: int) -> np.ndarray:
    """For each input position, the start of the document it belongs to."""
    owner = np.zeros(L, dtype=np.int64)
    owner[starts] = starts
    return np.maximum.accumulate(owner)


def to_megatron(batch: Batch, fmt: BatchFormat) -> dict[str, np.ndarray | None]:
    """One micro-batch as NumPy arrays keyed like Megatron's GPT batches."""
    tokens = np.ascontiguousarray(batch.input_ids, dtype=np.int64)
    labels = np.ascontiguousarray(batch.labels, dtype=np.int64)
    B, L = tokens.shape
    loss_mask = batch.loss_mask.astype(np.float32)
    if fmt.eod_mask_loss and fmt.eod_id is not None:
        loss_mask[tokens == fmt.eod_id] = 0.0
    need_docs = fmt.reset_position_ids or fmt.reset_attention_mask or fmt.cu_seqlens
    starts = document_starts(batch) if need_docs else None
    seg_start = np.stack([_segment_start_per_token(s, L) for s in starts]) if starts is not None else None
    ar = np.arange(L, dtype=np.int64)
    if fmt.reset_position_ids:
        assert seg_start is not None
        position_ids = ar[None, :] - seg_start
    else:
        position_ids = np.broadcast_to(ar, (B, L)).copy()
    out: dict[str, np.ndarray | None] = {k: None for k in KEYS}
    out.update(tokens=tokens, labels=labels, loss_mask=loss_mask, position_ids=position_ids)
    if fmt.attention_mask:
        # True where query i may NOT attend key j: the future, and (with
        # reset_attention_mask) keys before the start of i's document.
        blocked = ar[None, :] > ar[:, None]
        mask = np.broadcast_to(blocked, (B, L, L)).copy()
        if fmt.reset_attention_mask:
            assert seg_start is not None
            mask |= ar[None, None, :] < seg_start[:, :, None]
        out["attention_mask"] = mask[:, None, :, :]
    if fmt.cu_seqlens:
        assert starts is not None
        cu = np.full((B, L + 1), L, dtype=np.int32)
        max_len = np.zeros(B, dtype=np.int32)
        for r, s in enumerate(starts):
            bounds = np.concatenate([s, [L]]).astype(np.int32)
            cu[r, : bounds.size] = bounds
            max_len[r] = int(np.max(np.diff(bounds)))
        out["cu_seqlens"] = cu
        out["max_seqlen"] = max_len
    if fmt.source_ids:
        # Only with the option on: a micro-batch without it keeps exactly Megatron's keys.
        out["zephon_sources"] = label_sources(batch).astype(np.int64)
    return out


def to_torch(mb: dict[str, np.ndarray | None]) -> dict[str, Any]:
    """The same micro-batch as CPU tensors (sharing memory with the arrays)."""
    import torch

    return {k: (torch.from_numpy(v) if v is not None else None) for k, v in mb.items()}
