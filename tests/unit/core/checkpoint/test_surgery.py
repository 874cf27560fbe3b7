"""Skipping steps (issue #35): the steps after a skip of ``a..b`` are the uninterrupted run's steps after ``b``, on
any data-parallel degree and through later resumes; the skip is journaled, checked and refused where it cannot hold."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core import MemorySource, Pipeline, StaticMixture
from zephon_core.checkpoint import merge_states
from zephon_core.checkpoint.state import skip_in_state
from zephon_core.checkpoint.surgery import surgery_journal_of
from zephon_core.errors import StateError
from zephon_core.verify.simulate import Phase, first_mismatch, run_phase

DOCS = [[1 + i % 7] * (3 + i % 5) for i in range(60)]
C = 4


def _maker(shuffle: int = 0):
    src = MemorySource(DOCS, name="m")

    def make(dp_degree: int, dp_group_id: int) -> Pipeline:
        p = Pipeline(StaticMixture([src], seed=3, chunk_size=4)).pack(8)
        p = p.shuffle(shuffle, seed=1) if shuffle else p
        return p.batch(2).options(canonical_replicas=C, dp_degree=dp_degree, dp_group_id=dp_group_id, prefetch=0)
    return make


@settings(max_examples=12, deadline=None)
@given(before=st.integers(0, 4), length=st.integers(1, 5), after=st.integers(1, 4),
       degrees=st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4])),
       per_lane=st.sampled_from([1, 2]), shuffle=st.sampled_from([0, 3]))
def test_the_steps_after_a_skip_are_the_uninterrupted_steps_after_it(before, length, after, degrees, per_lane, shuffle):
    B = C * per_lane
    make = _maker(shuffle)
    reference, _ = run_phase(make, Phase(1, before + length + 2 * after), B, None)
    first, state = run_phase(make, Phase(degrees[0], before), B, None)
    skipped = skip_in_state(json.loads(json.dumps(state)), before + 1, before + length, B)
    rest, later = run_phase(make, Phase(degrees[1], after), B, skipped)
    assert surgery_journal_of(later) == surgery_journal_of(skipped)  # the journal travels through the merge
    again, _ = run_phase(make, Phase(degrees[2], after), B, later)
    expected = reference[:before] + reference[before + length:]
    assert first_mismatch(first + rest + again, expected, provenance=True) is None


def test_a_running_pipeline_skips_from_its_next_step_and_journals_it():
    make = _maker()
    reference, _ = run_phase(make, Phase(1, 6), C, None)
    p = make(1, 0)
    it = iter(p)
    got = [next(it).digest for _ in range(C)]  # step 1
    p.skip_steps(2, 3, C)
    got += [next(it).digest for _ in range(2 * C)]  # steps 4 and 5
    expect = [d for step in (0, 3, 4) for d in _batch_digests(make, step)]
    assert got == expect
    state = p.checkpoint()
    assert state["surgery"]["skips"] == [{"steps": [2, 3], "batches_per_lane": 1}]
    assert sum(ls["delivered"] for ls in state["lanes"].values()) == 5 * C  # the skipped steps count as delivered
    assert reference


def _batch_digests(make, step: int) -> list[str]:
    p = make(1, 0)
    it = iter(p)
    batches = [next(it) for _ in range((step + 1) * C)]
    return [b.digest for b in batches[step * C:]]


def test_a_state_without_surgery_has_no_journal_field():
    _, state = run_phase(_maker(), Phase(2, 1), C, None)
    assert "surgery" not in state and not surgery_journal_of(state)


def test_an_altered_journal_or_a_skip_of_steps_already_trained_is_refused():
    _, state = run_phase(_maker(), Phase(2, 3), C, None)
    skipped = skip_in_state(state, 4, 6, C)
    with pytest.raises(StateError, match="past step 1"):
        skip_in_state(state, 2, 5, C)
    with pytest.raises(StateError, match="multiple of canonical_replicas"):
        skip_in_state(state, 4, 5, C + 1)
    with pytest.raises(StateError, match="1 <= A <= B"):
        skip_in_state(state, 6, 4, C)
    edited = json.loads(json.dumps(skipped))
    edited["surgery"]["skips"][0]["steps"] = [4, 9]
    with pytest.raises(StateError, match="surgery.checksum"):
        _maker()(1, 0).restore(edited)
    with pytest.raises(StateError, match="another surgery journal"):
        merge_states([skipped, state])
    assert skip_in_state(skipped, 4, 6, C) == skipped  # the same skip twice is one entry
