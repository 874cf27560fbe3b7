"""A mixture Megatron's run steers by its own per-source loss (``--zephon-mixing``, the recipe's ``[mixing]``).

With the flag (it needs ``--zephon-source-loss``), each loading rank (tensor-parallel rank 0 of a stage that
reads micro-batches) wraps its training Pipeline in the core's ``MixingLoader``. At every ``--log-interval``
``MegatronSourceLoss`` hands every rank the per-source loss reduced over the data-parallel group (and, under
pipeline parallelism, broadcast from the last stage); the loading ranks then:

* ``record_loss`` those figures (equal on every rank);
* when a decision is due, one all-reduce over the data-parallel group of ``n_sources + dp`` int64s: the
  delivered tokens added up (SUM) and each rank's read frontier in its own slot, whose maximum is the MAX
  the core needs; ``decide`` journals the controller's weights as a stage at a global chunk no lane has read.

Each data-parallel group holds loading ranks only or none (tensor rank and stage are fixed along it), and the
loading ranks of one data-parallel rank (first and last stage) read the same lanes, so every one makes the same
decision. The journal lives in the data definition: the first stage's loader state (``zephon_megatron.state``)
holds it, and a resume on any data-parallel degree replays it (``MixingLoader.restore``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from zephon_core.integration import DENOMINATOR, Decision, LocalFigures, Mixing, MixingLoader, Recipe, SourceLoss
from zephon_megatron.args import Settings
from zephon_megatron.broadcast import comm_device
from zephon_megatron.validate import ZephonMegatronError


def mixing_of(settings: Settings, recipe: Recipe) -> Mixing | None:
    """The recipe's ``[mixing]`` when ``--zephon-mixing`` is on (None: off); refused in one line, on every rank,
    without the table or without ``--zephon-source-loss``."""
    if not settings.mixing:
        return None
    if not settings.source_loss:
        raise ZephonMegatronError("zephon: --zephon-mixing steers by the per-source loss; add --zephon-source-loss")
    mixing = recipe.mixing()
    if mixing is None:
        raise ZephonMegatronError(f"zephon: --zephon-mixing is on, but the recipe {settings.recipe} has no [mixing] "
                                  "table; add one (docs/mixing.md) or remove --zephon-mixing")
    return mixing


def reduce_figures(local: LocalFigures) -> LocalFigures:
    """``local`` combined over the data-parallel group in one all-reduce (see the module's docstring)."""
    if not (dist.is_available() and dist.is_initialized()):
        return local
    from megatron.core import mpu

    group = mpu.get_data_parallel_group()
    out = torch.tensor(local.slots(dist.get_world_size(group), dist.get_rank(group)), dtype=torch.int64)
    out = out.to(comm_device(group))
    dist.all_reduce(out, group=group)
    return LocalFigures.from_slots(out.cpu().tolist(), len(local.delivered_tokens))


def steer(loader: MixingLoader, figures: SourceLoss) -> Decision | None:
    """Hand one logged iteration's reduced per-source loss to ``loader``; decide when an interval is due."""
    loader.record_loss(figures.loss_sum, figures.loss_tokens)
    if not loader.due(figures.step):
        return None
    decision = loader.decide(figures.step, reduce_figures(loader.local_figures()))
    if decision is not None and (not dist.is_initialized() or dist.get_rank() == 0):  # one line per decision
        shares = " ".join(f"{name}={w / DENOMINATOR:.4f}" for name, w in decision.weights.items())
        print(f"zephon: mixing decision {len(loader.journal.decisions)} after iteration {decision.step}: "
              f"from global chunk {decision.start_chunk}, {shares} ({decision.controller})", flush=True)
    return decision


def steer_current(figures: SourceLoss | None, stream: Any) -> None:
    """After a logged iteration: steer this rank's training stream (a ``TrainStream``), when it has a mixture."""
    if figures is not None and stream is not None and isinstance(stream.pipeline, MixingLoader):
        steer(stream.pipeline, figures)
