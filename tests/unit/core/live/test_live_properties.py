"""Property-based tests (hypothesis) of live mode's data contract: under any schedule of replica groups dying before
or after the step's allreduce, joining, or failing their commit alone, in sync or async quorum, on any number of
slots and lanes, every committed step holds exactly the samples of that step in an uninterrupted run, no sample is
lost or repeated, and the durable checkpoint at the end resumes offline on any data-parallel degree exactly.

The replica groups are simulated in one process (``zephon_core.live.simulate``: torchft's protocol with the collectives
as sums in memory); ``tests/reliability/test_live_torchft.py`` proves the same with torchft's lighthouse and managers.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.property_strategies import divisors, recipes

from zephon_core import merge_states
from zephon_core.live.simulate import KINDS, Fault, LiveRun, reference_steps, simulate, violations

EXAMPLES = 400 if os.environ.get("ZEPHON_SOAK") else 25


@st.composite
def live_cases(draw):
    recipe = draw(recipes(max_docs=8, max_seq_len=8))
    C = draw(st.sampled_from([2, 4, 6, 8, 12]))
    S = draw(st.sampled_from(divisors(C)[:3]))
    steps = draw(st.integers(2, 6))
    fault = st.builds(Fault, st.integers(0, steps - 1), st.sampled_from(KINDS), st.integers(0, 5))
    faults = draw(st.lists(fault, max_size=4))
    return dict(recipe=recipe, C=C, S=S, k=draw(st.integers(1, 2)), replicas=draw(st.integers(1, 5)), steps=steps,
                faults=faults, mode=draw(st.sampled_from(["sync", "async"])))


def _make(recipe, C):
    return lambda S, j: recipe.pipeline().options(canonical_replicas=C, dp_degree=S, dp_group_id=j, prefetch=0)


@pytest.mark.topology
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=live_cases())
def test_every_committed_step_holds_exactly_its_samples_under_any_membership_changes(case):
    make = _make(case["recipe"], case["C"])
    ref = reference_steps(make, case["C"], case["k"], case["steps"] + 1)
    run = simulate(make, slots=case["S"], batches_per_lane=case["k"], replicas=case["replicas"], steps=case["steps"],
                   faults=case["faults"], mode=case["mode"])
    assert violations(run, {s: ref[s] for s in range(case["steps"])}) == []
    # The durable checkpoint: one copy of all lanes, resuming offline on another degree with the next step exactly.
    state = merge_states(run.final)
    G = max(d for d in divisors(case["C"]) if d <= 3)
    got = []
    for g in range(G):
        p = make(G, g)
        p.restore(state)
        it = iter(p)
        got += [next(it) for _ in range(case["k"] * case["C"] // G)]
        p.close()
    assert sorted((b.lane, b.lane_index, b.digest) for b in got) == ref[case["steps"]]


def test_the_check_catches_a_lost_and_a_repeated_sample():
    # The property above must be able to fail: a run that lost one sample and repeated another is reported.
    ref = {0: [(0, 0, "a"), (1, 0, "b")], 1: [(0, 1, "c"), (1, 1, "d")]}
    lossy = dataclasses.replace(LiveRun(), steps={0: [(0, 0, "a"), (1, 0, "b")], 1: [(0, 1, "c"), (0, 1, "c")]})
    problems = violations(lossy, ref)
    assert any(p.startswith("step 1") for p in problems) and any("committed 2 times" in p for p in problems)
