"""``LiveData``: one data-parallel rank's live lanes under a torchft Manager.

Per step, in the order torchft's own training loop runs them::

    optimizer.zero_grad()            # torchft's OptimizerWrapper: manager.start_quorum()
    step = data.begin()              # participants and this group's index -> this step's micro-batches
    for batch, weight in step.microbatches(): ...forward, loss * weight, backward (gradients allreduced)...
    data.exchange()                  # the lanes' new positions: one int64 SUM allreduce on the managed group
    committed = optimizer.step()     # manager.should_commit() decides; the optimizer steps only then
    data.settle(committed)           # the table advances only on a commit; otherwise the lanes rewind

``weight`` is ``P / (k x L)`` for a real micro-batch and 0 for a pad (``StepPlan.microbatch_weight``): with
each micro-batch's loss its own mean, the gradients averaged over the ``P`` participants make the step's
gradient the mean over its ``k x L`` micro-batches, whichever groups take part. A loss already averaged over
the group's micro-batches (TorchTitan's) takes ``step.plan.loss_scale`` (``P / A``) instead.

``settle`` may be called with ``manager.current_step()`` having advanced as the commit
signal when the framework calls ``should_commit`` itself (TorchTitan's optimizer wrapper).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.distributed import ReduceOp

from zephon_core import ConfigError
from zephon_core.live import LiveLanes, LiveStep, live_problems

#: The key of Zephon's table among the states torchft sends to a healing replica group.
STATE_KEY = "zephon"


def manager_problems(manager: Any, live: LiveLanes, slots: int) -> list[str]:
    """Live mode's start-up rules checked against a torchft Manager's settings."""
    C = len(live.slot_lanes) * slots
    return live_problems(canonical_replicas=C, slots=slots, min_replicas=int(manager._min_replica_size),
                         async_quorum=bool(manager._use_async_quorum), init_sync=bool(manager._init_sync))


class LiveData:
    """``live`` driven by ``manager``: quorum -> lanes, allreduce of the table, commit -> advance, heal -> table.

    ``slots`` is the number of data-parallel ranks in one replica group (``live``'s
    pipeline has ``dp_degree=slots``); a setting that breaks a rule is refused here, at
    start-up, with a one-line ``ConfigError``.
    """

    def __init__(self, live: LiveLanes, manager: Any, *, slots: int = 1, key: str = STATE_KEY) -> None:
        problems = manager_problems(manager, live, slots)
        if problems:
            raise ConfigError("zephon live mode: " + "; ".join(problems))
        self.live, self.manager = live, manager
        self._participants = 0
        self._summed: np.ndarray | None = None
        self._step_at_begin = 0
        manager.register_state_dict_fn(key, live.load_state_dict, live.state_dict)

    def begin(self) -> LiveStep:
        """This step attempt's micro-batches (after ``start_quorum``; waits for the quorum)."""
        m = self.manager
        self._participants = m.num_participants()
        index = m.participating_rank() if m.is_participating() else None
        self._summed = None
        self._step_at_begin = m.current_step()
        return self.live.begin(self._participants, index)

    def exchange(self) -> None:
        """The step's SUM allreduce of the lanes' positions; a disagreement between replicas fails the step."""
        m = self.manager
        table = torch.from_numpy(self.live.exchange())
        m.allreduce(table, reduce_op=ReduceOp.SUM).wait()
        if m.errored():  # a peer died: the step will not commit, the sum is not to be read
            return
        summed = table.numpy().copy()
        problems = self.live.problems(summed, self._participants)
        if problems:
            m.report_error(ConfigError("zephon live mode: " + "; ".join(problems)))
            raise ConfigError("zephon live mode: " + "; ".join(problems))
        self._summed = summed

    def settle(self, committed: bool | None = None) -> bool:
        """End the attempt: ``committed`` is ``should_commit()``'s vote (default: whether ``current_step()``
        advanced)."""
        if committed is None:
            committed = self.manager.current_step() > self._step_at_begin
        if committed and self._summed is None:
            raise ConfigError("zephon live mode: the step committed without a successful exchange() of the table")
        summed = self._summed if self._summed is not None else np.zeros(0)
        return self.live.settle(summed, self._participants, committed)
