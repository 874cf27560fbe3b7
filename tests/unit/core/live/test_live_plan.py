"""Live mode's arithmetic: who owns which lanes at a step, how many micro-batches every replica runs, the loss weight,
and the start-up rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon_core.live import active_participants, exact_participant_counts, live_problems, plan_step


@given(L=st.integers(1, 48), P=st.integers(1, 64), k=st.integers(1, 4), base=st.integers(0, 100))
def test_every_lane_has_exactly_one_owner_and_every_replica_runs_the_same_micro_batches(L, P, k, base):
    slot = list(range(base, base + L))
    plans = [plan_step(slot, P, r, k) for r in range(P)]
    owned = [lane for p in plans for lane in p.lanes]
    assert sorted(owned) == slot
    assert len({p.microbatches for p in plans}) == 1
    A = plans[0].active
    assert L % A == 0 and A <= P and all(L % d for d in range(A + 1, min(L, P) + 1))
    for p in plans:
        assert p.microbatches == k * len(p.lanes) + p.pads
    # The step's gradient: P replicas averaged, each the mean of its micro-batches, real ones weighted -> the mean
    # over the k x L real micro-batches (weight 1/(k L) each), as in a run where every replica owned lanes.
    per_real = [p.loss_scale / (P * p.microbatches) for p in plans if p.lanes]
    assert all(w == pytest.approx(1 / (k * L)) for w in per_real)
    assert all(p.loss_scale == 0 for p in plans if not p.lanes)


def test_a_replica_that_does_not_take_part_runs_pads_only():
    p = plan_step(list(range(12)), 3, None, 2)
    assert p.lanes == () and p.pads == p.microbatches == 8 and p.loss_scale == 0


def test_spares_when_the_participants_do_not_divide_the_lanes():
    # 12 lanes, 5 participants: 4 own 3 lanes each, the fifth is a spare; the active weight their loss by 5/4.
    plans = [plan_step(list(range(12)), 5, r, 1) for r in range(5)]
    assert [len(p.lanes) for p in plans] == [3, 3, 3, 3, 0]
    assert [p.pads for p in plans] == [0, 0, 0, 0, 3]
    assert plans[0].loss_scale == 1.25
    assert active_participants(12, 5) == 4 and active_participants(12, 40) == 12 and active_participants(7, 6) == 1
    assert exact_participant_counts(12) == [1, 2, 3, 4, 6, 12]


def test_an_index_outside_the_participants_is_refused():
    with pytest.raises(ValueError, match="participating_rank"):
        plan_step(list(range(4)), 2, 2, 1)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(canonical_replicas=12, slots=5, min_replicas=1, async_quorum=False, init_sync=True), "not divisible by"),
    (dict(canonical_replicas=12, slots=2, min_replicas=7, async_quorum=False, init_sync=True), "min_replica_size=7"),
    (dict(canonical_replicas=12, slots=2, min_replicas=0, async_quorum=False, init_sync=True), "min_replica_size=0"),
    (dict(canonical_replicas=12, slots=1, min_replicas=2, async_quorum=True, init_sync=True), "init_sync=False"),
])
def test_start_up_rules_refuse_in_one_line_naming_the_setting(kwargs, needle):
    problems = live_problems(**kwargs)
    assert len(problems) == 1 and needle in problems[0] and "\n" not in problems[0]


def test_start_up_rules_accept_sound_settings():
    assert live_problems(canonical_replicas=12, slots=2, min_replicas=2, async_quorum=True, init_sync=False) == []
    assert live_problems(canonical_replicas=12, slots=1, min_replicas=1, async_quorum=False, init_sync=True) == []
