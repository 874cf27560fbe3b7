"""A steered run resumed anywhere equals the uninterrupted run, decision for decision (issue #40, item 1).

The reference is the run that never stopped, on one group, steered by the same controller on the same losses;
never a replay of the resumed run's own journal. Checkpoints fall anywhere: between decisions, right after one
that changed nothing (ODM's first proposals are uniform), in the middle of a token interval.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_core import MemorySource, Pipeline, StaticMixture
from zephon_core.checkpoint.state import checksum_of
from zephon_core.checkpoint.steering import FIELD, clock_of
from zephon_core.curriculum.controllers import OdmController
from zephon_core.errors import ConfigError, StateError
from zephon_core.pipeline.mixing import LocalFigures, Mixing, MixingLoader
from zephon_core.verify.simulate import Phase, first_mismatch, run_phase

C = 4


def _mixture() -> StaticMixture:
    rng = np.random.default_rng(5)
    sources = [MemorySource([[i * 1000 + d] * (1 + int(rng.integers(0, 16))) for d in range(n)], name=f"s{i}")
               for i, n in enumerate([70, 50, 60])]
    return StaticMixture(sources, [1, 1, 1], seed=2, chunk_size=10)


def _loss(step: int, tokens: list[int]) -> tuple[list[float], list[int]]:
    """A stand-in loss that depends on what the step trained on (per-source tokens) and on the step."""
    per_token = [2.0 + (step % 5) / 10, 3.0, 2.5 - (step % 3) / 10]
    return [n * x for n, x in zip(tokens, per_token)], tokens


def _run(mixing_of, phases, state=None):
    """Steps of ``phases`` (each a resume from the last's merged state) steered as the adapters steer; the records,
    the final state and every decision made (equal on every group, checked)."""
    step = [0 if state is None else max(v["delivered"] for v in state["lanes"].values())]
    made: list = []
    tokens: dict[int, list[int]] = {}

    def make(G, gid):
        return MixingLoader(Pipeline(_mixture()).pack(8).shuffle(3).batch(2)
                            .options(canonical_replicas=C, dp_degree=G, dp_group_id=gid, readahead=2),
                            mixing_of())

    def on_batch(gid, batch):
        counts = tokens.setdefault(step[0] + 1, [0, 0, 0])
        for _, source, _, a, b in batch.segments.tolist():
            counts[source] += b - a

    def after(loaders):
        step[0] += 1
        figures = _loss(step[0], tokens.pop(step[0], [0, 0, 0]))
        for ld in loaders:
            ld.record_loss(*figures)
        if loaders[0].due(step[0]):
            figures = LocalFigures.reduced([ld.local_figures() for ld in loaders])
            decided = [ld.decide(step[0], figures) for ld in loaders]
            assert all(d == decided[0] for d in decided)
            made.append(decided[0])

    records = []
    for phase in phases:
        recs, state = run_phase(make, phase, C, state, on_batch=on_batch, after_step=after)
        state = json.loads(json.dumps(state))
        records.extend(recs)
    return records, state, made


def _odm(alpha, interval_steps=None, interval_tokens=None):
    return lambda: Mixing(OdmController(alpha), interval_steps=interval_steps, interval_tokens=interval_tokens,
                          min_share=0.05, max_change=0.2)


@pytest.mark.topology
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.floats(0.0, 0.95), st.one_of(st.tuples(st.integers(1, 5), st.none()),
                                       st.tuples(st.none(), st.integers(100, 600))),
       st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.integers(1, 9)), min_size=2, max_size=4))
def test_a_steered_run_resumed_anywhere_on_any_degree_is_the_uninterrupted_run(alpha, interval, phases):
    mixing_of = _odm(alpha, *interval)
    phases = [Phase(G, n) for G, n in phases]
    resumed, state, decided = _run(mixing_of, phases)
    whole, whole_state, whole_decided = _run(mixing_of, [Phase(1, sum(p.steps for p in phases))])
    assert decided == whole_decided  # every ask, the ones that changed nothing included
    assert first_mismatch(resumed, whole, provenance=True) is None
    assert state["definition"] == whole_state["definition"] and clock_of(state) == clock_of(whole_state)


def test_a_checkpoint_after_decisions_that_changed_nothing_resumes_exactly():
    """The case the issue found: ODM's first proposals are uniform (no journal entry), so only the clock knows the
    controller was asked; a checkpoint there and one mid-interval."""
    mixing_of = _odm(0.9, interval_steps=4)
    whole, _, whole_decided = _run(mixing_of, [Phase(1, 30)])
    assert whole_decided[0] is None and any(d is not None for d in whole_decided)
    for split in (4, 6, 9):
        resumed, _, decided = _run(mixing_of, [Phase(2, split), Phase(4, 30 - split)])
        assert decided == whole_decided, split
        assert first_mismatch(resumed, whole, provenance=True) is None, split


def test_the_clock_is_checked_and_must_fit_the_run():
    _, state, _ = _run(_odm(0.5, interval_steps=3), [Phase(2, 5)])
    clock = clock_of(state)
    assert clock is not None and clock.asked_at == 3 and sum(clock.loss_tokens) > 0
    edited = json.loads(json.dumps(state))
    edited[FIELD]["asked_at"] = 4
    edited["checksum"] = checksum_of(edited)
    with pytest.raises(StateError, match="steering.checksum"):
        clock_of(edited)
    loader = MixingLoader(Pipeline(_mixture()).pack(8).batch(2).options(canonical_replicas=C),
                          Mixing(OdmController(0.5), interval_steps=3))
    loader.mixing.controller.name = "other"  # type: ignore[misc]
    with pytest.raises(ConfigError, match="controller 'odm'"):
        loader.restore(state)
