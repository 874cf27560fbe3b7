"""Per-source training loss on TorchTitan: this rank's tally, and its reduction at each logged step.

Imports torch, never torchtitan. The loader (``ZephonStream`` with ``source_loss``) queues each
delivered batch's label source ids (``zephon_core.integration.label_sources``); the loss
(``tt03.ZephonCrossEntropyLoss``, inside ``tt03.ZephonChunkedLossWrapper`` when chunked) takes them in
the order the batches left the loader, one batch per micro-batch (``begin``), and adds each training
call's per-token loss to their sources, a call's labels' columns at a time (a chunk of the sequence).
At every logged step the metrics processor (``metrics.MetricsLogging``) reduces the ``[2, n_sources]`` table:

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
        self._current: np.ndarray | None = None  # the ids of the micro-batch loss calls are taking
        self._column = 0  # its columns the calls already took
        self._last: torch.Tensor | None = None  # its labels, as the loss saw them
        self._table = torch.zeros(2, len(names), dtype=torch.float64)  # the micro-batches before the current one
        self._micro = torch.zeros_like(self._table)  # the current micro-batch's
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

    def begin(self, labels: torch.Tensor) -> None:
        """A training loss call starts a micro-batch: the next queued batch's ids are the ones it takes.

        A call on the labels the previous one had is the same micro-batch again, not the next one: torch's
        pipeline schedules compute the first micro-batch's loss twice in their first step, the first time on
        outputs that are not the training step's. The last call counts: it replaces what the earlier one added.
        One comparison per micro-batch (a device synchronisation on an accelerator).
        """
        last = self._last
        self._column = 0
        if last is not None and last.shape == labels.shape and last.device == labels.device \
                and torch.equal(last, labels):
            self._micro.zero_()
            return
        if not self._pending:
            raise IntegrationError("zephon: source_loss: a training loss call has no Zephon batch to attribute; "
                                   "per-source loss needs the Zephon training loader")
        self._commit()
        self._current, self._last = self._pending.popleft(), labels

    def add(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Add one loss call's per-token cross entropy (no gradient) to the sources of its labels: the next
        ``labels.shape[-1]`` columns of the micro-batch ``begin`` started."""
        ids = self._current
        if ids is None:
            return
        rows, cols = labels.shape[0], labels.shape[-1]
        if rows != ids.shape[0] or self._column + cols > ids.shape[1]:
            raise IntegrationError(
                f"zephon: source_loss: the loss saw labels {tuple(labels.shape)} where the loader delivered "
                f"{tuple(ids.shape)}; per-source loss does not support context parallelism; turn source_loss off")
        part = torch.from_numpy(np.ascontiguousarray(ids[:, self._column:self._column + cols])).reshape(-1)
        self._column += cols
        with torch.no_grad():
            nll = F.cross_entropy(logits.detach().flatten(0, -2).float(), labels.reshape(-1), reduction="none")
            part = part.to(nll.device)
            keep = part >= 0
            src = part[keep].to(torch.int64)
            # The tables live where the logits do: no copy to the host per loss call.
            self._micro = self._micro.to(nll.device)
            self._micro[0].index_add_(0, src, nll[keep].double())
            self._micro[1].index_add_(0, src, torch.ones(len(src), dtype=torch.float64, device=nll.device))

    def _commit(self) -> None:
        """The current micro-batch's figures into the interval's."""
        self._table = self._table.to(self._micro.device) + self._micro
        self._micro = torch.zeros_like(self._micro)

    def reduce(self, step: int, parallel_dims: Any) -> SourceLoss:
        """The figures since the previous call, summed over the data-parallel ranks, equal on every rank."""
        self._commit()
        table, self._table = self._table, torch.zeros_like(self._table)
        # A rank that computes no loss (a pipeline stage before the last) leaves its ids here.
        self._pending.clear()
        self._current, self._column, self._last = None, 0, None
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
