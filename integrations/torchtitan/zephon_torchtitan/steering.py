"""A mixture TorchTitan's run steers by its own per-source loss (the recipe's ``[mixing]``, docs/mixing.md).

Imports torch, never torchtitan. With the loader's ``mixing`` on, the training stream wraps its pipeline
in the core's ``MixingLoader``; at every logged step the metrics processor reduces the per-source loss
(``source_loss``) and hands it to ``steer``, on every rank:

* ``record_loss`` adds the step's figures (equal on every rank: reduced over the ``loss`` mesh and,
  under pipeline parallelism, broadcast from the last stage);
* when a decision is due, one all-reduce over the ``loss`` mesh combines each rank's read frontier
  (MAX) and per-source delivered tokens (SUM), and ``decide`` journals the controller's weights as a
  stage at a global chunk no lane has read. Pipeline stages of one data-parallel rank hold the same
  lanes, so their figures, and their decisions, are equal without a further collective.

The journal lives in the data definition, so TorchTitan's checkpoint holds it (``ZephonStream.state_dict``)
and a resume on any data-parallel degree replays it (``MixingLoader.restore``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from zephon_core.integration import DENOMINATOR, Decision, LocalFigures, MixingLoader, SourceLoss
from zephon_torchtitan.core import LOG


def reduce_figures(local: LocalFigures, parallel_dims: Any) -> LocalFigures:
    """``local`` combined over the ``loss`` mesh in one all-reduce (sum): the delivered tokens added up, and the
    frontiers each in its rank's own slot, whose maximum is the MAX reduction the core asks for."""
    mesh = parallel_dims.get_optional_mesh("loss") if parallel_dims is not None else None
    if mesh is None or not (dist.is_available() and dist.is_initialized()):
        return local
    group = mesh.get_group()
    table = torch.tensor(local.slots(dist.get_world_size(group), dist.get_rank(group)), dtype=torch.int64)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    out = table.to(device)
    dist.all_reduce(out, group=group)
    return LocalFigures.from_slots(out.cpu().tolist(), len(local.delivered_tokens))


def steer(loader: MixingLoader, figures: SourceLoss, parallel_dims: Any) -> Decision | None:
    """Hand one logged step's reduced per-source loss to ``loader`` and decide when an interval is due."""
    loader.record_loss(figures.loss_sum, figures.loss_tokens)
    if not loader.due(figures.step):
        return None
    decision = loader.decide(figures.step, reduce_figures(loader.local_figures(), parallel_dims))
    if decision is not None:
        shares = " ".join(f"{name}={w / DENOMINATOR:.4f}" for name, w in decision.weights.items())
        LOG.info(f"zephon: mixing decision {len(loader.journal.decisions)} after step {decision.step}: "
                 f"from global chunk {decision.start_chunk}, {shares} ({decision.controller})")
    return decision
