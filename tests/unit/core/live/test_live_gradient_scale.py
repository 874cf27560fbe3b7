"""The live loop's gradient scale: the documented recipe (backpropagate ``loss * weight`` for each of
``LiveStep.microbatches()``, the framework's allreduce averaging over the participants) trains every step on the mean
over its micro-batches, whichever replica groups take part. The micro-batch count of a replica changes with the
membership (12 lanes, 2 batches per lane: 8 at 3 groups, 12 at 2), so a weight without its ``1 / M`` would jump the
gradient (a learning-rate jump) at every leave and join.

The model is linear: micro-batch ``i``'s loss is ``x_i . w`` with ``x_i`` read off its tokens, so its gradient is
``x_i`` and the step's gradient is a weighted sum of the ``x_i`` that NumPy computes exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.core_fixtures import mixture, token_pipeline

from zephon_core import Batch
from zephon_core.live import LiveLanes

C, K, GROUPS = 12, 2, 5
PAD = np.array([1e6, -1e6, 1e6])  # what a pad's gradient would be if its weight were not 0


def make() -> LiveLanes:
    ws = mixture((120, 80), (0.7, 0.3))
    return LiveLanes(token_pipeline(ws, seq_len=12, batch_size=2, shuffle_window=3, canonical_replicas=C), K)


def features(batch: Batch | None) -> np.ndarray:
    """``x``: the gradient of the micro-batch's loss ``x . w`` (a pad's is large, to show it weighs nothing)."""
    if batch is None:
        return PAD
    ids = np.asarray(batch.input_ids, dtype=np.float64) % 9973
    return np.array([ids.mean(), ids.std(), float(batch.lane + 1)])


def documented_recipe(step) -> np.ndarray:
    """One replica group's gradient: ``sum(loss_i * weight_i)`` backpropagated (docs/live_elasticity.md's loop)."""
    return sum((features(b) * w for b, w in step.microbatches()), np.zeros(3))


def titan_recipe(step) -> np.ndarray:
    """TorchTitan's: the loss is already the mean over the group's micro-batches with a valid label (pads have none),
    weighted ``plan.loss_scale`` (zephon_torchtitan.ft)."""
    real = [features(b) for b in step.batches]
    return step.plan.loss_scale * np.mean(real, axis=0) if real else np.zeros(3)


@pytest.mark.parametrize("recipe", [documented_recipe, titan_recipe], ids=["documented", "torchtitan"])
def test_the_step_gradient_is_the_mean_over_its_micro_batches_whatever_the_membership(recipe):
    groups = [make() for _ in range(GROUPS)]
    # 3 groups, then 2 (a leave: 8 -> 12 micro-batches each), then 5 (12 lanes: 4 own 3 each, one spare), then 4
    # with the fifth healing (not participating: pads only).
    for s, P in enumerate([3, 2, 5, 4]):
        steps = [g.begin(P, i if i < P else None) for i, g in enumerate(groups)]
        assert {st.plan.microbatches for st in steps} == {K * C // steps[0].plan.active}
        # The framework's allreduce: the participants' gradients averaged over P (a healing group's is zeroed).
        gradient = sum(recipe(st) for st in steps[:P]) / P
        real = [b for st in steps for b in st.batches]
        assert len(real) == K * C and {b.lane_index // K for b in real} == {s}
        np.testing.assert_allclose(gradient, np.mean([features(b) for b in real], axis=0), rtol=1e-12)
        summed = np.sum([g.exchange() for g in groups], axis=0)
        for g in groups[P:]:  # healing: the table of a participant, as torchft's state transfer
            g.load_state_dict(groups[0].state_dict())
        for g in groups:
            assert g.settle(summed, P, committed=True)
    for g in groups:
        g.close()


def test_each_real_micro_batch_is_weighted_participants_over_the_step_s_micro_batches():
    live = make()
    three, two = live.begin(3, 0), live.begin(2, 0)
    assert (three.plan.microbatches, two.plan.microbatches) == (8, 12)
    assert {w for _, w in three.microbatches()} == {3 / 24} and {w for _, w in two.microbatches()} == {2 / 24}
    spare = live.begin(5, 4)
    assert spare.plan.lanes == () and {w for _, w in spare.microbatches()} == {0.0}
    live.close()
