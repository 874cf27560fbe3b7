"""``LiveLanes``: the table's encoding, commit and discard, healing, refusals, and the durable checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.core_fixtures import mixture, token_pipeline

from zephon_core import Pipeline, StateError
from zephon_core.errors import ConfigError
from zephon_core.live import LiveLanes
from zephon_core.live.simulate import reference_steps

C, K = 6, 2


def make(S: int = 1, j: int = 0, **kw) -> Pipeline:
    ws = kw.pop("ws", None) or mixture((120, 80), (0.7, 0.3))
    return token_pipeline(ws, seq_len=12, batch_size=2, shuffle_window=3, canonical_replicas=C, dp_degree=S,
                          dp_group_id=j, **kw)


def alone(steps: int) -> LiveLanes:
    """A live slot that one replica took through ``steps`` committed steps."""
    live = LiveLanes(make(), K)
    for _ in range(steps):
        live.begin(1, 0)
        live.settle(live.exchange(), 1, committed=True)
    return live


def samples(batches):
    return sorted((b.lane, b.lane_index, b.digest) for b in batches)


def test_a_lone_replica_commits_the_reference_steps_and_its_table_round_trips():
    ref = reference_steps(make, C, K, 3)
    with_live = LiveLanes(make(), K)
    for s in range(3):
        step = with_live.begin(1, 0)
        assert step.step == s and step.plan.lanes == tuple(range(C)) and step.plan.pads == 0
        assert samples(step.batches) == ref[s]
        table = with_live.exchange()
        assert table.dtype == np.int64 and table.nbytes == with_live.table_bytes
        assert with_live.problems(table, 1) == []
        assert with_live.settle(table, 1, committed=True)
    assert with_live.step == 3
    # The committed table is exactly what the pipeline itself reports after the same batches.
    p = make()
    it = iter(p)
    for _ in range(3 * K * C):
        next(it)
    assert with_live.committed() == p._lane_states()
    with_live.close()


def test_a_discarded_attempt_consumes_nothing_whether_or_not_the_assignment_changes():
    ref = reference_steps(make, C, K, 2)
    live = LiveLanes(make(), K)
    first = live.begin(2, 0)
    live.exchange()
    assert not live.settle(np.zeros(0), 2, committed=False)
    again = live.begin(2, 0)  # same lanes: the same batches, not the next ones
    assert samples(again.batches) == samples(first.batches)
    live.settle(np.zeros(0), 2, committed=False)
    alone = live.begin(1, 0)  # another assignment: every lane from its committed position
    assert samples(alone.batches) == ref[0]
    assert live.settle(live.exchange(), 1, committed=True) and live.step == 1
    assert samples(live.begin(1, 0).batches) == ref[1]
    live.close()


def test_two_replicas_sum_their_tables_and_both_hold_every_lane():
    a, b = LiveLanes(make(), K), LiveLanes(make(), K)
    sa, sb = a.begin(2, 0), b.begin(2, 1)
    assert set(sa.plan.lanes) | set(sb.plan.lanes) == set(range(C)) and not set(sa.plan.lanes) & set(sb.plan.lanes)
    summed = a.exchange() + b.exchange()
    for live in (a, b):
        assert live.problems(summed, 2) == [] and live.settle(summed, 2, committed=True)
    assert a.committed() == b.committed() and a.state_dict() == b.state_dict()
    a.close(), b.close()


def test_disagreements_are_refused_naming_what_differs():
    a = LiveLanes(make(), K)
    other = LiveLanes(make(ws=mixture((120, 80), (0.5, 0.5))), K)
    a.begin(2, 0), other.begin(2, 1)
    summed = a.exchange() + other.exchange()
    assert any("data definition" in p for p in a.problems(summed, 2))
    with pytest.raises(StateError, match="data definition"):
        a.settle(summed, 2, committed=True)
    # one lane twice: both replicas think they are index 0
    b = LiveLanes(make(), K)
    b.begin(2, 0)
    twice = a.exchange() + b.exchange()
    assert any("delivered" in p and "not once" in p for p in a.problems(twice, 2))
    # a stale replica at another step
    c = LiveLanes(make(), K)
    c.begin(1, 0)
    c.settle(c.exchange(), 1, committed=True)
    d = LiveLanes(make(), K)
    c.begin(2, 0), d.begin(2, 1)
    assert any("committed step" in p for p in c.problems(c.exchange() + d.exchange(), 2))
    assert "contributed" in a.problems(a.exchange(), 2)[0]
    for live in (a, other, b, c, d):
        live.close()


def test_a_healing_replica_takes_the_peers_table_and_continues_exactly():
    ref = reference_steps(make, C, K, 3)
    old = alone(2)
    new = LiveLanes(make(), K)
    transferred = json.loads(json.dumps(old.state_dict()))  # plain JSON: no pickle needed on any transport
    new.load_state_dict(transferred)
    assert new.step == 2 and new.committed() == old.committed()
    s_old, s_new = old.begin(2, 0), new.begin(2, 1)
    assert samples(s_old.batches + s_new.batches) == ref[2]
    for live in (old, new):
        live.close()


def _edited(text: str) -> str:
    state = json.loads(text)
    state["lanes"]["0"]["cursor"][0] += 1  # a flipped cursor that still parses
    return json.dumps(state)


@pytest.mark.parametrize("mutate, needle", [
    (lambda v: {**v, "format": "pickle"}, "not a 'zephon.live' table"),
    (lambda v: {**v, "state": "{"}, "not valid JSON"),
    (lambda v: {**v, "step": 5}, "header says 5"),
    (lambda v: {**v, "state": _edited(v["state"])}, "checksum"),
])
def test_a_damaged_transfer_is_refused(mutate, needle):
    live = alone(1)
    value = live.state_dict()
    with pytest.raises(StateError, match=needle):
        LiveLanes(make(), K).load_state_dict(mutate(value))
    live.close()


def test_a_transfer_from_another_slot_is_refused():
    a = LiveLanes(make(2, 0), K)
    with pytest.raises(StateError, match="lacks lane"):
        LiveLanes(make(2, 1), K).load_state_dict(a.state_dict())


def test_the_durable_checkpoint_restores_offline_on_another_data_parallel_degree():
    ref = reference_steps(make, C, K, 3)
    live = alone(2)
    state = json.loads(json.dumps(live.checkpoint()))
    got = []
    for g in range(3):  # dp=3 with C=6: two lanes each, k batches per lane per step
        p = make(3, g)
        p.restore(state)
        it = iter(p)
        got += [next(it) for _ in range(2 * K)]
    assert samples(got) == ref[2]
    live.close()


def test_live_mode_refuses_a_state_that_is_not_at_a_step_boundary_and_an_uneven_slot():
    p = make()
    it = iter(p)
    next(it)
    state = p.checkpoint()
    q = make()
    q.restore(state)
    with pytest.raises(StateError, match="same step boundary"):
        LiveLanes(q, K)
    with pytest.warns(RuntimeWarning), pytest.raises(ConfigError, match="divisible"):
        LiveLanes(token_pipeline(mixture(), canonical_replicas=6, dp_degree=4, dp_group_id=0), 1)
