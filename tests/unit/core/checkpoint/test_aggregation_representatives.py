"""Fewer writers: at a launch's first checkpoint every rank writes; then one representative per dp group
(global rank g * stride) writes for its peers. A missing or wrong representative is named or refused,
never merged silently. Ranks are threads of this process (tests/support/simranks.py), their file-system
operations counted with zephon_dev/fsops.py."""

from __future__ import annotations

import json
import random

import pytest
from support.simranks import SimRanks, mesh

from zephon_core import AggregationError
from zephon_dev.fsops import count


def counted(ranks: SimRanks) -> list:
    return [count(a.dir) for a in ranks.aggs]


def ok(results: dict, n: int, step: int) -> dict:
    states = list(results.values())
    assert len(states) == n and all(isinstance(s, dict) for s in states), [s for s in states if not isinstance(s, dict)][:2]
    assert all(s == states[0] for s in states), "ranks returned different merged states"
    assert {v["delivered"] for v in states[0]["lanes"].values()} == {step}
    return states[0]


def writers(ops: list) -> list[int]:
    return [r for r, o in enumerate(ops) if o.by_kind["write"] or o.by_kind["put"] or o.by_kind["rename"]]  # the leader publishes by rename


@pytest.mark.parametrize("pp, tp, dp", [(1, 8, 4), (2, 2, 4), (4, 1, 4)])
def test_first_checkpoint_every_rank_writes_then_one_per_dp_group(tmp_path, pp, tp, dp):
    W = pp * tp * dp
    ranks = SimRanks(str(tmp_path), "run", world_size=W, dp=dp, layout=mesh(tp=tp), fan_in=4)
    ops = counted(ranks)
    ok(ranks.checkpoint(1), W, 1)
    assert writers(ops) == list(range(W))
    for step in (2, 3):
        for o in ops:
            o.reset()
        ok(ranks.checkpoint(step), W, step)
        assert writers(ops) == [g * tp for g in range(dp)], "the lowest rank of each dp group writes, no other"
        for r, o in enumerate(ops):
            if r % tp:  # a non-writer only reads the merged state
                assert set(o.by_file) == {"merged"} and set(o.by_kind) == {"open"}, (r, o.as_dict())
            assert o.by_kind["list"] == 0 and (o.by_kind["delete"] == 0 or r == 0), (r, o.as_dict())


def test_an_irregular_layout_keeps_every_rank_writing(tmp_path):
    groups = [g for g in range(4) for _ in range(3)]
    random.Random(5).shuffle(groups)
    if groups[0] != 0:  # rank 0 must be in group 0 for any representative scheme; make sure no stride fits either
        groups[groups.index(0)], groups[0] = groups[0], 0
    ranks = SimRanks(str(tmp_path), "run", world_size=12, dp=4, layout=lambda r, dp: groups[r], fan_in=4)
    ops = counted(ranks)
    ok(ranks.checkpoint(1), 12, 1)
    for o in ops:
        o.reset()
    ok(ranks.checkpoint(2), 12, 2)
    assert ranks.aggs[0].next is not None and ranks.aggs[0].next.writers.stride is None
    assert writers(ops) == list(range(12))


def test_a_missing_representative_is_named_and_nothing_is_published(tmp_path):
    W, dp = 32, 4
    ranks = SimRanks(str(tmp_path), "run", world_size=W, dp=dp, timeout_s=5.0, fan_in=4)  # the others arrive in time on a busy machine
    ok(ranks.checkpoint(1), W, 1)
    announced = ranks.aggs[1].next
    got = ranks.checkpoint(2, absent={16})
    err = got[0]
    assert isinstance(err, AggregationError), err
    assert "global rank(s) [16] (the representative(s) of dp group(s) [2])" in str(err) and "did not call checkpoint()" in str(err), err
    assert all(isinstance(v, AggregationError) for v in got.values()), "no rank may return a state of an incomplete round"
    assert not (tmp_path / "run" / f"merged-{announced.token}.json").exists()
    # The next attempt (every rank writes again) goes through, at the ranks' new step.
    ok(ranks.checkpoint(3), W, 3)


def test_a_representative_with_another_identity_is_refused(tmp_path):
    W, dp = 32, 4
    ranks = SimRanks(str(tmp_path), "run", world_size=W, dp=dp, timeout_s=2.0, fan_in=4)
    ok(ranks.checkpoint(1), W, 1)
    announced = ranks.aggs[0].next
    got = ranks.checkpoint(2, states={8: ranks.state(8, 2, group=2)})  # dp group 1's writer now claims group 2
    err = got[0]
    assert isinstance(err, AggregationError) and "global rank 8 writes as the representative of dp group 1" in str(err), err
    assert "holds dp_group_id=2" in str(err), err
    assert not (tmp_path / "run" / f"merged-{announced.token}.json").exists()
    assert not [r for r, v in got.items() if isinstance(v, dict)]


def test_a_representative_at_another_step_is_refused_by_its_peers(tmp_path):
    """Rank 8 writes for dp group 1 a state one step behind its peers 9..15: each peer refuses the merged
    state, naming the representative, instead of returning another step's progress as its own."""
    W, dp = 32, 4
    ranks = SimRanks(str(tmp_path), "run", world_size=W, dp=dp, timeout_s=2.0, fan_in=4)
    ok(ranks.checkpoint(1), W, 1)
    got = ranks.checkpoint(2, states={8: ranks.state(8, 1)})
    for r in range(9, 16):
        assert isinstance(got[r], AggregationError), (r, got[r])
        msg = str(got[r])
        assert f"does not carry global rank {r}'s progress unchanged" in msg and "from global rank 8 (dp group 1's representative)" in msg, msg
        assert "did not checkpoint at the same step" in msg, msg


def test_peers_that_disagree_in_a_round_where_all_write_fail_the_leader(tmp_path):
    """At a launch's first checkpoint peers are compared: rank 9, one step behind, is caught below a
    merging writer (rank 8 with fan-in 4), whose part carries the error up to the leader."""
    W, dp = 32, 4
    ranks = SimRanks(str(tmp_path), "run", world_size=W, dp=dp, timeout_s=5.0, fan_in=4)
    got = ranks.checkpoint(2, states={9: ranks.state(9, 1)})
    err = got[0]
    assert isinstance(err, AggregationError) and "did not checkpoint at the same step" in str(err), err
    assert "global rank 9" in str(err) and "lane 1 differs" in str(err), err
    assert not [n for n in (tmp_path / "run").iterdir() if n.name.startswith("merged-")]


def test_a_non_writer_that_never_comes_holds_nobody_up(tmp_path):
    """Its progress is its representative's: the round completes without it (nothing of it is lost)."""
    W, dp = 32, 4
    ranks = SimRanks(str(tmp_path), "run", world_size=W, dp=dp, fan_in=4)
    ok(ranks.checkpoint(1), W, 1)
    got = ranks.checkpoint(2, absent={13})
    ok(got, W - 1, 2)


def test_a_merged_file_announces_the_writers_of_the_next_round(tmp_path):
    ranks = SimRanks(str(tmp_path), "run", world_size=16, dp=4, fan_in=4)
    ok(ranks.checkpoint(1), 16, 1)
    name = next(n for n in (tmp_path / "run").iterdir() if n.name.startswith("merged-"))
    header = json.loads(name.read_bytes().split(b"\n", 1)[0])
    assert header["next"]["writers"] == {"world_size": 16, "groups": 4, "stride": 4}
    assert header["next"]["token"] == ranks.aggs[5].next.token


@pytest.mark.parametrize("later, most", [(False, 32), (True, 16)], ids=["first round", "later round"])
def test_ranks_wait_for_a_late_leader_without_tight_polling(tmp_path, later, most):
    """The leader comes 3 s after everyone else; polling every 50 ms would be 60 looks per rank. Ranks
    pause longer and longer (up to 2 s; timing only: a slower machine makes fewer looks, never more).
    At a first round a rank looks for round.json from 5 ms on (1.5x each time), then for the merged
    file (2x): about 20 looks; later it waits until the merged file is due, then 1.5x: about 11."""
    W, dp = 16, 4
    ranks = SimRanks(str(tmp_path), "run", world_size=W, dp=dp, fan_in=4)
    if later:
        ok(ranks.checkpoint(1), W, 1)
    ops = counted(ranks)
    ok(ranks.checkpoint(2, delay={0: 3.0}), W, 2)
    for r, o in enumerate(ops[1:], start=1):
        looks = o.by_file["round"] + o.by_file["merged"]
        assert 1 <= looks <= most, (r, o.as_dict())


@pytest.mark.parametrize("tp, dp", [(1, 64), (8, 8)])
def test_metadata_operations_per_rank_stay_within_the_goal(tmp_path, tp, dp):
    """Issue 15's goal, <= 5 metadata operations per rank per checkpoint, counted (not timed) at 64 ranks: with every
    rank its own dp group (Megatron's layout) and with representatives, a launch's first checkpoint included.

    Looks for files that are not there yet depend on timing (threads on a shared machine), so the goal is held
    over the launch's checkpoints; each part is one write, whatever the timing."""
    W, rounds = 64, 4
    ranks = SimRanks(str(tmp_path), "run", world_size=W, dp=dp, layout=mesh(tp=tp))
    ops = counted(ranks)
    per_round = []
    for step in range(1, rounds + 1):
        for o in ops:
            o.reset()
        ok(ranks.checkpoint(step), W, step)
        per_round.append(sum(o.metadata for o in ops) / W)
        for r, o in enumerate(ops[1:], start=1):
            assert o.by_kind["create"] == o.by_kind["rename"] == o.by_kind["list"] == 0, (r, o.as_dict())
            assert o.by_kind["write"] == (r % tp == 0 or step == 1), (r, o.as_dict())
    assert sum(per_round) / rounds <= 5.0, per_round


def test_a_relaunchs_first_checkpoint_is_due_when_the_last_launchs_was(tmp_path):
    """round.json, closed, says how long the launch's first round took; the next launch of this world size
    carries it in the round it opens, and its ranks look for the merged state that long after their call,
    once (the leader is done long before), instead of guessing from the number of writers."""
    W, dp = 16, 4
    first = SimRanks(str(tmp_path), "run", world_size=W, dp=dp, fan_in=4)
    ok(first.checkpoint(1), W, 1)
    round_file = tmp_path / "run" / "round.json"
    closed = json.loads(round_file.read_bytes())
    assert closed["status"] == "closed" and 0 < closed["took"] < 30, closed
    closed["took"] = 1.5  # as if that first round had taken 1.5 s: timing only, so any figure is safe
    round_file.write_text(json.dumps(closed))
    relaunch = SimRanks(str(tmp_path), "run", world_size=W, dp=dp, fan_in=4)
    ops = counted(relaunch)
    ok(relaunch.checkpoint(2), W, 2)
    for r, o in enumerate(ops[1:], start=1):
        assert o.by_file["merged"] == 1 and relaunch.took[r] >= 1.5 * 0.99, (r, relaunch.took[r], o.as_dict())
    assert json.loads(round_file.read_bytes())["took"] < 1.5, "the relaunch's round.json says what its own round took"
    # A launch that took very long (a rank came late) delays the next one's first look by a quarter of its timeout at most.
    closed["took"] = 1000.0
    round_file.write_text(json.dumps(closed))
    late = SimRanks(str(tmp_path), "run", world_size=W, dp=dp, fan_in=4, timeout_s=4.0)
    ok(late.checkpoint(3), W, 3)
    assert 0.99 <= min(late.took[r] for r in range(1, W)) and max(late.took.values()) < 3.0, late.took
    # Another world size never takes the figure: 8 ranks guess (0.1 s) and are done long before 1.5 s.
    closed["took"] = 1.5
    round_file.write_text(json.dumps(closed))
    other = SimRanks(str(tmp_path), "run8", world_size=8, dp=4, fan_in=4)
    (tmp_path / "run8").mkdir(exist_ok=True)
    (tmp_path / "run8" / "round.json").write_text(json.dumps(closed))
    ok(other.checkpoint(1), 8, 1)
    assert max(other.took.values()) < 1.5, other.took
