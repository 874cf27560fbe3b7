"""The drill's model and the peer loader's data: a tiny causal LM trained on CPU under a torchft Manager.

``train_attempt`` runs one step attempt's micro-batches the way a fault-tolerant data-parallel
trainer does: each micro-batch's mean loss times its weight (``LiveStep.microbatches``'s, which
makes the step's gradient the mean over its micro-batches), its gradient averaged across the replica groups
by ``manager.allreduce`` (one flat tensor per micro-batch, so every replica must run the same
number of them), and the averaged gradients summed into ``.grad`` for the optimizer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

IGNORE = -100


class TinyLM(nn.Module):
    """An embedding and a linear head: next-token logits from the current token alone."""

    def __init__(self, vocab: int, width: int = 16) -> None:
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


#: One micro-batch: ``(input_ids, labels)`` as ``[B, L]`` arrays (labels IGNORE where not trained), None for a pad,
#: and the weight of its mean loss in the step (1 / micro-batches for a plain mean).
Micro = tuple[tuple[np.ndarray, np.ndarray] | None, float]


def build_model(vocab: int, seed: int = 0) -> tuple[TinyLM, torch.optim.Optimizer]:
    """The same initial weights on every replica group (``seed``), and its optimizer."""
    torch.manual_seed(seed)
    model = TinyLM(vocab)
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def train_attempt(model: TinyLM, manager: Any, micro: Sequence[Micro], shape: tuple[int, int]) -> float:
    """Forward and backward of every micro-batch, each one's gradient averaged across the replica groups."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    loss_sum = 0.0
    for rows, weight in micro:
        ids, labels = rows if rows is not None else (np.zeros(shape, np.int64), np.full(shape, IGNORE, np.int64))
        x = torch.from_numpy(np.ascontiguousarray(ids)).long() % model.vocab
        y = torch.from_numpy(np.ascontiguousarray(labels)).long()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, model.vocab), y.reshape(-1), ignore_index=IGNORE)
        if not torch.isfinite(loss):  # a micro-batch without a trained label (a pad)
            loss = logits.sum() * 0.0
        scaled = loss * weight  # the weight holds the 1 / (micro-batches) of the step's mean
        grads = torch.autograd.grad(scaled, params)
        flat = torch.cat([g.reshape(-1) for g in grads])
        manager.allreduce(flat).wait()  # AVG over the participants; zeroed by torchft when this group is healing
        offset = 0
        for acc, p in zip(total, params):
            acc += flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        loss_sum += float(scaled.detach())
    for p, g in zip(params, total):
        p.grad = g
    return loss_sum


def batch_rows(input_ids: np.ndarray, labels: np.ndarray, loss_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A Zephon batch as ``(input_ids, labels)`` with the labels not trained set to IGNORE."""
    return input_ids, np.where(loss_mask, labels, IGNORE)


class DocumentRows(torch.utils.data.Dataset):
    """The peer's map-style dataset: document ``i`` of a JSONL file, tokenized, as one row of ``seq_len + 1`` tokens
    (cut or padded), so torchft's ``DistributedSampler`` can shard it by index."""

    def __init__(self, path: str, text_field: str, tokenizer: Any, seq_len: int, bos_id: int | None,
                 eos_id: int | None) -> None:
        with open(path, encoding="utf-8") as f:
            self.texts = [json.loads(line)[text_field] for line in f if line.strip()]
        self.tokenizer, self.seq_len = tokenizer, seq_len
        self.ends = ([bos_id] if bos_id is not None else [], [eos_id] if eos_id is not None else [])

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        ids = self.ends[0] + list(self.tokenizer.encode(self.texts[i]).ids) + self.ends[1]
        row = np.full(self.seq_len + 1, IGNORE, np.int64)
        ids = ids[: self.seq_len + 1]
        row[: len(ids)] = ids
        inputs = np.where(row[:-1] == IGNORE, 0, row[:-1])
        return inputs, row[1:]
