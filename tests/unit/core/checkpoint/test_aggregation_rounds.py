"""Aggregation rounds across launches that share one aggregate_dir and run_id (ranks as threads)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from zephon_core import AggregationError, MemorySource, Pipeline, StaticMixture


def make(rank: int, agg: str, world: int = 2, timeout: float = 20.0) -> Pipeline:
    ws = StaticMixture([MemorySource([[i] * (3 + i % 5) for i in range(200)], name="d")], seed=4, chunk_size=8)
    return Pipeline(ws).pack(seq_len=8).batch(2).options(
        world_size=world, global_rank=rank, canonical_replicas=world, aggregate_dir=agg, run_id="run", aggregate_timeout_s=timeout, prefetch=0
    )


def checkpoint_all(pipelines: list[Pipeline], batches: int, follower_first: bool = False) -> list:
    for p in pipelines:
        it = iter(p)
        for _ in range(batches):
            next(it)
    out: list = [None] * len(pipelines)

    def run(r: int) -> None:
        try:
            out[r] = pipelines[r].checkpoint()
        except Exception as e:  # handed back to the test
            out[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(pipelines))]
    order = threads[1:] + threads[:1] if follower_first else threads
    for t in order:
        t.start()
        if follower_first and t is order[0]:
            time.sleep(0.5)  # the follower finds the previous launch's round first
    for t in threads:
        t.join(60)
    return out


def test_a_new_launch_never_takes_the_previous_launchs_merged_state(tmp_path):
    agg = str(tmp_path)
    first = checkpoint_all([make(r, agg) for r in range(2)], batches=1)
    assert all(isinstance(s, dict) for s in first), first
    second = checkpoint_all([make(r, agg) for r in range(2)], batches=3, follower_first=True)
    assert all(isinstance(s, dict) for s in second), second
    assert second[0] == second[1]
    assert all(v["delivered"] == 3 for v in second[0]["lanes"].values())


def test_consecutive_rounds_of_one_launch(tmp_path):
    agg = str(tmp_path)
    pipelines = [make(r, agg) for r in range(2)]
    for k in (1, 2, 3):
        states = checkpoint_all(pipelines, batches=1)
        assert states[0] == states[1] and all(v["delivered"] == k for v in states[0]["lanes"].values())


def test_a_round_leaves_the_process_python_random_stream_alone(tmp_path):
    # The training owns the process-wide ``random``: Megatron checkpoints its state and restores it on
    # resume. Draws here (jittered pauses, as many as a rank's timing and role need) made two
    # context-parallel peers' checkpoints differ in length, and their shared model_optim_rng.pt torn (#42).
    random.seed(42)
    before = random.getstate()
    states = checkpoint_all([make(r, str(tmp_path)) for r in range(2)], batches=2)
    assert all(isinstance(s, dict) for s in states), states
    assert random.getstate() == before


def test_leader_names_a_rank_that_never_comes(tmp_path):
    p = make(0, str(tmp_path), world=3, timeout=1.0)
    next(iter(p))
    with pytest.raises(AggregationError, match=r"global rank\(s\) \[1, 2\]"):
        p.checkpoint()


def test_rounds_through_a_loopback_s3_server(s3_endpoint):
    agg = s3_endpoint.url("agg-unit")
    ws = StaticMixture([MemorySource([[i] * (3 + i % 5) for i in range(200)], name="d")], seed=4, chunk_size=8)
    pipelines = [
        Pipeline(ws).pack(seq_len=8).batch(2).options(
            world_size=4, global_rank=r, canonical_replicas=4, aggregate_dir=agg, run_id="run", aggregate_timeout_s=60,
            storage_options=dict(s3_endpoint), prefetch=0,
        )
        for r in range(4)
    ]
    for k in (1, 2):
        states = checkpoint_all(pipelines, batches=1)
        assert all(s == states[0] for s in states), states
        assert all(v["delivered"] == k for v in states[0]["lanes"].values())
    left = sorted(p.rsplit("/", 1)[-1] for p in s3_endpoint.filesystem().ls(s3_endpoint.url("agg-unit", "run"), detail=False))
    # One part per writer (overwritten each round), the last two merged states, round.json: nothing grows with the rounds.
    assert [n for n in left if n.startswith("part-")] == ["part-1.json", "part-2.json", "part-3.json"], left
    assert len([n for n in left if n.startswith("merged-")]) == 2 and "round.json" in left and len(left) == 6, left


def test_a_follower_joins_the_announced_round_at_once(tmp_path):
    """After a round, a follower knows the next round's token (from the merged file): it writes its
    state before reading round.json, even before the leader has opened the round."""
    agg = str(tmp_path)
    pipelines = [make(r, agg) for r in range(2)]
    assert all(isinstance(s, dict) for s in checkpoint_all(pipelines, batches=1))
    d = pipelines[1]._aggregator.dir
    calls: list = []
    for name in ("get", "write"):
        real = getattr(d, name)
        setattr(d, name, lambda n, *a, _real=real, _name=name: (calls.append((_name, n)), _real(n, *a))[1])
    it = iter(pipelines[0])
    next(it)
    leader_out: list = []
    leader = threading.Thread(target=lambda: (time.sleep(0.5), leader_out.append(pipelines[0].checkpoint())))
    leader.start()  # late: the follower must not wait for its round.json
    states = checkpoint_all(pipelines[1:], batches=1)
    leader.join(60)
    assert isinstance(states[0], dict) and leader_out and leader_out[0] == states[0], (states, leader_out)
    token = pipelines[0]._aggregator.leader.published[-1]
    assert calls[0] == ("write", "part-1.json") and calls[1:] and all(c == ("get", f"merged-{token}.json") for c in calls[1:]), calls
    assert b'"token":"' + token.encode() in (tmp_path / "run" / "part-1.json").read_bytes()


def test_a_failed_rounds_token_is_never_reused(tmp_path):
    """The leader's round fails (the follower is late); the follower then writes for the token it was
    announced, the leader opens a fresh round, and the follower moves to it."""
    agg = str(tmp_path)
    pipelines = [make(0, agg, timeout=1.0), make(1, agg)]
    assert all(isinstance(s, dict) for s in checkpoint_all(pipelines, batches=1))
    announced = pipelines[1]._aggregator.next
    assert announced and announced == pipelines[0]._aggregator.next
    next(iter(pipelines[0]))
    with pytest.raises(AggregationError, match=r"global rank\(s\) \[1\]"):
        pipelines[0].checkpoint()
    states = checkpoint_all(pipelines, batches=1)
    assert all(isinstance(s, dict) for s in states) and states[0] == states[1], states
    assert pipelines[0]._aggregator.leader.published[-1] != announced.token
    assert sorted(v["delivered"] for v in states[0]["lanes"].values()) == [2, 3]  # rank 0 took one more batch


def test_a_part_caught_mid_write_is_never_taken():
    """Parts are written in place: every prefix of one, and one with another round's bytes behind a new header, is "not there"."""
    from zephon_core.checkpoint.records import Round, decode_part, encode_part, why_not_a_part
    from zephon_core.checkpoint.state import make_state
    from zephon_core.checkpoint.tree import Writers

    st = make_state({"x": 1}, 2, {"dp_degree": 2, "dp_group_id": 1, "world_size": 2, "global_rank": 1}, {})
    rnd, old = (Round(t * 32, 1, Writers(2, 2, None)) for t in "ab")
    data = encode_part(rnd, 0, 1, st, None)
    assert decode_part(data, "p", rnd, 0, 1) is not None
    for n in range(len(data)):
        assert decode_part(data[:n], "p", rnd, 0, 1) is None, n
    head = data.split(b"\n", 1)[0]
    earlier = make_state({"x": 2}, 2, st["topology"], {})  # the last round's part, of other bytes, behind this round's header
    mixed = head + b"\n" + encode_part(old, 0, 1, earlier, None).split(b"\n", 1)[1]
    assert decode_part(mixed, "p", rnd, 0, 1) is None
    assert why_not_a_part(data[: len(data) - 3], rnd).startswith("an incomplete part of this round")
