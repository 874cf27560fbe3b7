"""Live mode's arithmetic: which lanes of a slot each participant owns in one step attempt, and the start-up rules.

A replica group's data-parallel rank ``j`` serves *slot* ``j``: the ``L = C / S`` lanes that a
``Pipeline`` with ``dp_degree=S, dp_group_id=j`` owns. At every step the ``P`` participants of
the quorum split each slot again. Gradient sync runs once per micro-batch, so every replica
must run the same number of micro-batches: the slot is split among ``A``, the largest divisor
of ``L`` not above ``P``, *active* participants, ``L / A`` lanes each; the other ``P - A`` are
spares for that step. A spare (and a replica that is not participating, e.g. healing) runs the
same number of micro-batches as pads whose loss weight is 0. An active replica's loss over its
``M = k x L / A`` micro-batches is weighted ``P / A`` when it is their mean (``loss_scale``), so
each micro-batch's own loss is weighted ``P / (A x M) = P / (k x L)`` (``microbatch_weight``):
averaged over the ``P`` participants by the framework's allreduce, the step's gradient is the
mean over its ``k x L`` real micro-batches whatever the membership, as in a run where every
replica was active. A weight without the ``1 / M`` would make the gradient ``M`` times that mean,
and ``M`` changes with the membership (a learning-rate jump at every leave or join).
"""

from __future__ import annotations

from dataclasses import dataclass

from zephon_core.validation import require_int


@dataclass(frozen=True)
class StepPlan:
    """One replica's part of one step attempt in one slot."""

    participants: int
    """``P``: replica groups taking part in the step (torchft's ``num_participants()``)."""
    index: int | None
    """This replica among them (``participating_rank()``), None when it does not take part (healing)."""
    active: int
    """``A``: participants that own lanes this step (the largest divisor of ``L`` not above ``P``)."""
    lanes: tuple[int, ...]
    """The lanes this replica delivers this step (global lane numbers, empty for a spare)."""
    microbatches: int
    """Micro-batches every replica runs this step: ``k x L / A``."""
    pads: int
    """Of those, the zero-weight pads this replica runs (all of them for a spare)."""
    loss_scale: float
    """The weight of this replica's loss when it is already the mean over its ``microbatches`` (TorchTitan divides by
    the step's valid tokens): ``P / A``, 0 for a spare, whose micro-batches are all pads."""

    @property
    def microbatch_weight(self) -> float:
        """The weight of each real micro-batch's own loss, summed over the micro-batches: ``loss_scale / microbatches``
        (``P / (k x L)``), so that the allreduce's average over the ``P`` participants is the step's mean."""
        return self.loss_scale / self.microbatches


def active_participants(lanes_per_slot: int, participants: int) -> int:
    """The largest divisor of ``lanes_per_slot`` that is at most ``participants``."""
    return max(d for d in range(1, min(lanes_per_slot, participants) + 1) if lanes_per_slot % d == 0)


def exact_participant_counts(lanes_per_slot: int) -> list[int]:
    """Participant counts at which every replica owns lanes (no spares): the divisors of ``L``."""
    return [d for d in range(1, lanes_per_slot + 1) if lanes_per_slot % d == 0]


def plan_step(slot_lanes: list[int], participants: int, index: int | None, batches_per_lane: int) -> StepPlan:
    """This replica's lanes, micro-batches, pads and loss weight for a step with ``participants`` replicas."""
    L, k = len(slot_lanes), batches_per_lane
    P = require_int(participants, "live mode: num_participants()", 1)
    A = active_participants(L, P)
    per = L // A
    if index is not None and not 0 <= index < P:
        raise ValueError(f"live mode: participating_rank()={index} is not below num_participants()={P}")
    owned = tuple(slot_lanes[index * per : (index + 1) * per]) if index is not None and index < A else ()
    M = k * per
    return StepPlan(P, index, A, owned, M, M - k * len(owned), P / A if owned else 0.0)


def live_problems(*, canonical_replicas: int, slots: int, min_replicas: int, async_quorum: bool, init_sync: bool,
                  slots_name: str = "data-parallel ranks per replica group") -> list[str]:
    """The start-up rules of live mode, one line each with the setting to change (empty when all hold)."""
    C, S = canonical_replicas, slots
    problems = []
    if S < 1 or C % S:
        problems.append(
            f"canonical_replicas={C} is not divisible by the {slots_name} ({S}): each of them serves C / {S} lanes; "
            f"use a canonical_replicas that is a multiple of {S}")
        return problems
    L = C // S
    if not 1 <= min_replicas <= L:
        problems.append(
            f"torchft min_replica_size={min_replicas} must be between 1 and the lanes per slot ({L} = "
            f"canonical_replicas {C} / {S}): a quorum larger than the lanes leaves replicas without data at every "
            "step; lower min_replica_size or raise canonical_replicas")
    if async_quorum and init_sync:
        problems.append(
            "torchft Manager(use_async_quorum=True, init_sync=True) commits step 0 without the lanes of the replicas "
            "that heal at start-up (they train one step behind from then on); build the Manager with init_sync=False "
            "(every replica starts from the same seed or checkpoint) or with use_async_quorum=False")
    return problems


def live_data_problems(*, mixing: bool = False, surgery: str | None = None, skip_ahead: str | None = None,
                       without_torchft: str = "a run without torchft") -> list[str]:
    """Live mode's start-up rules on steering and surgery, one line each with the reason and the fix (empty: none).

    ``mixing``: the run would steer its mixture (``MixingLoader``, a steered pipeline, TorchTitan's ``mixing``, a
    recipe's ``[mixing]`` table); ``surgery``: where a ``[surgery]`` table asks for skip_steps or quarantine (its
    ``where``); ``skip_ahead``: a journaled skip (``zephon skip``, an earlier ``[surgery]``) the lanes have not
    passed; ``without_torchft``: how the framework runs without torchft, named in the fixes."""
    out = []
    if mixing:
        out.append(
            "steering (mixing) is refused in live mode (torchft): a decision's step and start chunk come from the "
            "lanes' losses and read frontier, which the replica groups split anew at every step and discard with an "
            "attempt, and that is not proven to give every group the same decision; turn mixing off (or take the "
            f"recipe's [mixing] table out) for the live run, or steer in {without_torchft}")
    if surgery:
        out.append(
            f"{surgery}: a [surgery] table (skip_steps, quarantine) is refused in live mode (torchft): torchft's "
            "trainer trains every committed step, and each replica group would journal the table at its own start "
            f"from its own lanes' positions; apply it in {without_torchft}, then take the table out and start the "
            "live run from that checkpoint, which journals it")
    if skip_ahead:
        out.append(
            f"the loader state's surgery journal skips {skip_ahead}, which live mode (torchft) cannot honour: its "
            "trainer trains every committed step, so it would train the batches after them as those steps (and a "
            f"live step is its lanes' position); train past the skip in {without_torchft}, then start the live run "
            "from that checkpoint")
    return out
