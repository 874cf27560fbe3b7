"""Per-source training loss on TorchTitan: this rank's tally, and its reduction at each logged step.

Imports torch, never torchtitan. The loader (``ZephonStream`` with ``source_loss``) queues each
delivered batch's label source ids (``zephon_core.integration.label_sources``); the loss
(``tt03.ZephonCrossEntropyLoss``) adds each training call's per-token loss to its sources, taking the
ids in the order the batches left the loader, a loss call's labels' columns at a time (TorchTitan's
``ChunkedLossWrapper`` calls it once per chunk of the sequence). At every logged step the metrics
processor (``metrics.MetricsLogging``) reduces the ``[2, n_sources]`` table:

* one all-reduce (sum) over TorchTitan's ``loss`` mesh (the data-parallel ranks), then
* under pipeline parallelism, one broadcast over the ``pp`` mesh from its last stage, the only one
  that computes a loss, so that every rank (in TorchTitan every rank loads data) holds the figures.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from zephon_core import Batch
from zephon_core.integration import IntegrationError, SourceLoss, label_sources, source_loss_of

#: Batches queued without a loss call taking them before the loader refuses: nothing consumes the figures.
MAX_PENDING = 4096


class SourceLossTally:
    """This rank's per-source loss since the previous logged step, and the interval's reduced figures."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self._pending: deque[np.ndarray] = deque()
        self._column = 0  # columns of the oldest pending batch that loss calls already took
        self._table = torch.zeros(2, len(names), dtype=torch.float64)
        self.delivered_tokens = 0  # counted label tokens queued since the previous reduction

    def delivered(self, batch: Batch) -> None:
        """Queue the label source ids of a batch the training loader hands out."""
        if len(self._pending) >= MAX_PENDING:
            raise IntegrationError(
                "zephon: source_loss is on, but no logged step has taken the per-source loss of the last "
                f"{MAX_PENDING} batches; add zephon_torchtitan.zephon_metrics to --override.imports")
        ids = label_sources(batch)
        self.delivered_tokens += int((ids >= 0).sum())
        self._pending.append(ids)

    def add(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Add one loss call's per-token cross entropy to the sources of its labels (no gradient)."""
        if not self._pending:
            raise IntegrationError("zephon: source_loss: a training loss call has no Zephon batch to attribute; "
                                   "per-source loss needs the Zephon training loader")
        ids = self._pending[0]
        rows, cols = labels.shape[0], labels.shape[-1]
        if rows != ids.shape[0] or self._column + cols > ids.shape[1]:
            raise IntegrationError(
                f"zephon: source_loss: the loss saw labels {tuple(labels.shape)} where the loader delivered "
                f"{tuple(ids.shape)}; per-source loss does not support context parallelism; turn source_loss off")
        part = torch.from_numpy(np.ascontiguousarray(ids[:, self._column:self._column + cols])).reshape(-1)
        self._column += cols
        if self._column == ids.shape[1]:
            self._pending.popleft()
            self._column = 0
        with torch.no_grad():
            nll = F.cross_entropy(logits.detach().flatten(0, -2).float(), labels.reshape(-1), reduction="none")
            part = part.to(nll.device)
            keep = part >= 0
            src = part[keep].to(torch.int64)
            # The table lives where the logits do: no copy to the host per loss call.
            self._table = self._table.to(nll.device)
            self._table[0].index_add_(0, src, nll[keep].double())
            self._table[1].index_add_(0, src, torch.ones(len(src), dtype=torch.float64, device=nll.device))

    def reduce(self, step: int, parallel_dims: Any) -> SourceLoss:
        """The figures since the previous call, summed over the data-parallel ranks, equal on every rank."""
        table, self._table = self._table, torch.zeros_like(self._table)
        # A rank that computes no loss (a pipeline stage before the last) leaves its ids here.
        self._pending.clear()
        self._column = 0
        delivered, self.delivered_tokens = self.delivered_tokens, 0
        figures = source_loss_of(step, self.names, reduce_table(table, parallel_dims).tolist())
        if delivered and not sum(figures.loss_tokens):
            raise IntegrationError("zephon: source_loss is on, but the training loss attributed no token to a source; "
                                   "add zephon_torchtitan.zephon_source_loss to --override.imports")
        return figures


def reduce_table(table: torch.Tensor, parallel_dims: Any) -> torch.Tensor:
    """``table`` summed over the ``loss`` mesh, then broadcast from the last pipeline stage (see the module)."""
    if parallel_dims is None or not (dist.is_available() and dist.is_initialized()):
        return table
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    out = table.to(device).contiguous()
    loss_mesh = parallel_dims.get_optional_mesh("loss")
    if loss_mesh is not None:
        dist.all_reduce(out, group=loss_mesh.get_group())
    if parallel_dims.pp_enabled:
        pp_group = parallel_dims.get_optional_mesh("pp").get_group()
        dist.broadcast(out, src=dist.get_global_rank(pp_group, dist.get_world_size(pp_group) - 1), group=pp_group)
    return out.cpu()
