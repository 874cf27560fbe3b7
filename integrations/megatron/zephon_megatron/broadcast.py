"""Send a micro-batch from tensor-parallel rank 0 to its peers, on any backend.

Megatron's own ``get_batch_on_this_tp_rank`` allocates receive buffers with
fixed shapes on ``torch.cuda.current_device()``. This broadcast instead sends a
small header first (shapes, which optional pieces follow, the batch's lane,
index and digest), so peers never wait for a piece that is not coming, and it
communicates on the device the group's backend needs: CUDA for NCCL, CPU for
gloo.

Three collectives per micro-batch: the header, one int64 payload (tokens,
labels, position ids, the loss mask's float32 bits, and ``cu_seqlens`` /
``max_seqlen`` and the label source ids ``zephon_sources`` when present), and the attention mask as uint8 when present.
With ``ZEPHON_BATCH_LOG`` set the header also carries a checksum of the
payload, which every peer verifies.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist

from zephon_core.integration import LoggedBatch

_HEADER_LEN = 12
_F_ATTN, _F_CU, _F_CHECK, _F_SRC = 1, 2, 4, 8


class MicroBatch(dict):
    """A micro-batch dict that also carries its batch's identity (``meta``: lane, index in the lane, digest, run).

    ``key in batch`` is False for pieces that are None, so scripts that test for
    an optional piece (``"attention_mask" in data``) and scripts that index it
    (``batch["attention_mask"]``) both work.
    """

    meta: LoggedBatch | None = None

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) and dict.__getitem__(self, key) is not None


def comm_device(group: Any = None) -> torch.device:
    """The device collectives of ``group`` run on: CUDA when its backend is NCCL, else CPU."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _digest_words(hexdigest: str) -> tuple[int, int]:
    raw = bytes.fromhex(hexdigest.rjust(32, "0")[-32:])
    return int.from_bytes(raw[:8], "little", signed=True), int.from_bytes(raw[8:], "little", signed=True)


def _words_digest(a: int, b: int) -> str:
    return (int(a).to_bytes(8, "little", signed=True) + int(b).to_bytes(8, "little", signed=True)).hex()


def _checksum(payload: torch.Tensor) -> tuple[int, int]:
    data = payload.detach().to("cpu").contiguous().numpy().tobytes()
    return _digest_words(hashlib.blake2b(data, digest_size=16).hexdigest())


def _pack(batch: MicroBatch, device: Any, verify: bool) -> tuple[list[int], torch.Tensor]:
    """The sender's header values and its one int64 payload: tokens, labels, positions, the loss mask's
    float32 bits and, for packed rows, ``cu_seqlens`` and ``max_seqlen``."""
    tokens = batch["tokens"]
    B, L = tokens.shape
    cu = batch.get("cu_seqlens")
    parts = [
        tokens.reshape(-1).to(torch.int64),
        batch["labels"].reshape(-1).to(torch.int64),
        batch["position_ids"].reshape(-1).to(torch.int64),
        batch["loss_mask"].to(torch.float32).contiguous().view(torch.int32).reshape(-1).to(torch.int64),
    ]
    if cu is not None:
        parts += [cu.reshape(-1).to(torch.int64), batch["max_seqlen"].reshape(-1).to(torch.int64)]
    sources = batch.get("zephon_sources")
    if sources is not None:
        parts.append(sources.reshape(-1).to(torch.int64))
    payload = torch.cat([p.to(device) for p in parts])
    meta = batch.meta
    attn = batch.get("attention_mask")
    flags = ((_F_ATTN if attn is not None else 0) | (_F_CU if cu is not None else 0) | (_F_CHECK if verify else 0)
             | (_F_SRC if sources is not None else 0))
    d0, d1 = _digest_words(meta.digest) if meta else (0, 0)
    c0, c1 = _checksum(payload) if verify else (0, 0)
    run = _digest_words(meta.run)[1] if meta and meta.run else 0  # the run fingerprint's 16 hex digits
    values = [B, L, flags, cu.shape[1] if cu is not None else 0, meta.lane if meta else -1,
              meta.lane_index if meta else -1, d0, d1, c0, c1, payload.numel(), run]
    return values, payload


def broadcast_microbatch(batch: MicroBatch | None, *, src: int, group: Any, verify: bool = False) -> MicroBatch:
    """Rank ``src`` (a global rank) passes its ``batch``; every rank of ``group`` returns it.

    Tensors come back on ``comm_device(group)``. ``verify`` (all ranks must
    agree on it) adds the payload checksum that peers check.
    """
    device = comm_device(group)
    sender = dist.get_rank() == src
    header = torch.zeros(_HEADER_LEN, dtype=torch.int64, device=device)
    if sender:
        assert batch is not None, "tensor-parallel rank 0 has no micro-batch to send"
        values, payload = _pack(batch, device, verify)
        header.copy_(torch.tensor(values, dtype=torch.int64))
    dist.broadcast(header, src, group=group)
    B, L, flags, cu_w, lane, lane_index, d0, d1, c0, c1, n, run = (int(v) for v in header.cpu().tolist())
    if not sender:
        payload = torch.empty(n, dtype=torch.int64, device=device)
    dist.broadcast(payload, src, group=group)
    if sender:
        assert batch is not None
        out = MicroBatch({k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()})
        out.meta = batch.meta
        if flags & _F_ATTN:
            dist.broadcast(batch["attention_mask"].to(device=device, dtype=torch.uint8).contiguous(), src, group=group)
        return out
    if flags & _F_CHECK and _checksum(payload) != (c0, c1):
        raise RuntimeError(f"zephon: the micro-batch received from tensor-parallel rank 0 (global rank {src}) is corrupt: checksum mismatch")
    BL = B * L
    out = MicroBatch()
    out["tokens"] = payload[0:BL].view(B, L)
    out["labels"] = payload[BL : 2 * BL].view(B, L)
    out["loss_mask"] = payload[3 * BL : 4 * BL].to(torch.int32).view(torch.float32).view(B, L)
    attention_mask = None
    if flags & _F_ATTN:
        buf = torch.empty((B, 1, L, L), dtype=torch.uint8, device=device)
        dist.broadcast(buf, src, group=group)
        attention_mask = buf.to(torch.bool)
    out["attention_mask"] = attention_mask
    out["position_ids"] = payload[2 * BL : 3 * BL].view(B, L)
    start = 4 * BL
    if flags & _F_CU:
        out["cu_seqlens"] = payload[start : start + B * cu_w].to(torch.int32).view(B, cu_w)
        out["max_seqlen"] = payload[start + B * cu_w : start + B * cu_w + B].to(torch.int32)
        start += B * cu_w + B
    if flags & _F_SRC:
        out["zephon_sources"] = payload[start : start + BL].view(B, L)
    out.meta = (LoggedBatch.identity(lane, lane_index, _words_digest(d0, d1), _words_digest(0, run)[16:] if run else "")
                if lane >= 0 else None)
    return out
