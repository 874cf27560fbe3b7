"""Data identity, checkpoint aggregation and elastic restore across real MPI ranks.

Every rank is its own process with its own Pipeline; the only coordination
the pipelines use is the aggregate directory (local or s3:// on a loopback
server). gloo collectives are used only by the tests to compare results.
"""

from __future__ import annotations

import os
import time
import uuid

import numpy as np
import pytest
from zephon_dist_helpers import C, pipeline, reference_steps, take_step_rows

from zephon_core import AggregationError


def _flatten(groups: list[list[str]]) -> list[str]:
    return sorted(d for g in groups for d in g)


@pytest.mark.mpi(min_size=4)
def test_device_mesh_dp_tp_peers_identical_groups_disjoint(gloo_pg, rank, world_size, allgather):
    if world_size % 2:
        pytest.skip("needs an even number of ranks for a (dp, tp=2) mesh")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size // 2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh["dp"]
    G, gid = dp.size(), dp.get_local_rank()
    p = pipeline(dp_degree=G, dp_group_id=gid, prefetch=1)
    B = 2 * C  # batches per global step over all groups
    it = iter(p)
    mine = [take_step_rows(it, B // G) for _ in range(3)]
    everyone = allgather((gid, mine))
    by_group: dict[int, list] = {}
    for g, rows in everyone:
        if g in by_group:
            assert rows == by_group[g], f"tensor-parallel peers of dp group {g} produced different batches"
        by_group[g] = rows
    assert sorted(by_group) == list(range(G))
    ref = reference_steps(3, B)
    for step in range(3):
        step_rows = [by_group[g][step] for g in range(G)]
        all_rows = _flatten(step_rows)
        assert len(set(all_rows)) == len(all_rows) or all_rows.count(all_rows[0]) == 1, "a row was delivered twice in one step"
        assert all_rows == ref[step], f"global step {step} differs from the single-group reference"
    p.close()


@pytest.mark.mpi(min_size=8)
def test_hsdp_mesh_flattened_as_the_guide_shows(gloo_pg, rank, world_size, allgather):
    if world_size != 8:
        pytest.skip("the 2x2x2 HSDP example needs exactly 8 ranks")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
    replicate, shard = mesh["dp_replicate"], mesh["dp_shard"]
    G = replicate.size() * shard.size()
    gid = replicate.get_local_rank() * shard.size() + shard.get_local_rank()
    p = pipeline(dp_degree=G, dp_group_id=gid)
    it = iter(p)
    mine = take_step_rows(it, C // G)
    everyone = allgather((gid, mine))
    groups = {}
    for g, rows in everyone:
        assert groups.setdefault(g, rows) == rows, f"tp peers of dp group {g} differ"
    assert sorted(groups) == [0, 1, 2, 3]
    assert _flatten(list(groups.values())) == reference_steps(1, C)[0]
    p.close()


def _aggregate_dir(kind: str, shared_tmp, s3_endpoint_factory, allgather) -> tuple[str, dict]:
    if kind == "local":
        return str(shared_tmp / "agg"), {}
    ep = s3_endpoint_factory()
    prefix = allgather(uuid.uuid4().hex)[0]
    return ep.url(prefix), dict(ep)


@pytest.fixture
def s3_lazy(request):
    return lambda: request.getfixturevalue("s3_endpoint")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("where", ["local", "s3"])
def test_every_rank_checkpoints_tp_peers_deduplicated(where, gloo_pg, rank, world_size, allgather, shared_tmp, s3_lazy):
    """Strategy 1: every rank builds a Pipeline; coordination = the whole job."""
    tp = 2 if world_size % 2 == 0 else 1
    G, gid = world_size // tp, rank // tp
    agg, so = _aggregate_dir(where, shared_tmp, s3_lazy, allgather)
    run_id = "every-rank"
    opts = dict(world_size=world_size, global_rank=rank, aggregate_dir=agg, run_id=run_id, aggregate_timeout_s=60, storage_options=so)
    p = pipeline(dp_degree=G, dp_group_id=gid, **opts)
    it = iter(p)
    B = C
    for _ in range(2):
        take_step_rows(it, B // G)
    t0 = time.perf_counter()
    state = p.checkpoint()
    elapsed = time.perf_counter() - t0
    states = allgather(state)
    assert all(s == states[0] for s in states), "ranks returned different merged states"
    assert sorted(int(k) for k in state["lanes"]) == list(range(C))
    assert all(v["delivered"] == 2 * B // C for v in state["lanes"].values())
    # A second round in the same run reuses the folder; old rounds are cleaned up.
    take_step_rows(it, B // G)
    state2 = p.checkpoint()
    assert all(v["delivered"] == 3 * B // C for v in state2["lanes"].values())
    import torch.distributed as dist

    dist.barrier()
    if rank == 0 and where == "local":
        # Nothing grows with the number of rounds: round.json, at most one part per rank (overwritten at
        # each round), the last two merged states (for readers a round behind), no write left in flight.
        left = sorted(os.listdir(os.path.join(agg, run_id)))
        parts = [n for n in left if n.startswith("part-")]
        merged = [n for n in left if n.startswith("merged-")]
        assert sorted(set(left) - set(parts) - set(merged)) == ["round.json"], left
        assert len(merged) <= 2 and len(parts) <= world_size - 1, left
    if rank == 0:
        print(f"aggregation {where} world_size={world_size}: {elapsed * 1000:.1f} ms")
    p.close()


@pytest.mark.mpi(min_size=2)
def test_one_pipeline_per_dp_group(gloo_pg, rank, world_size, allgather, shared_tmp):
    """Strategy 2: only tp rank 0 of each dp group builds a Pipeline; coordination = the dp group."""
    import torch.distributed as dist

    tp = 2 if world_size % 2 == 0 else 1
    G, gid, tp_rank = world_size // tp, rank // tp, rank % tp
    state = None
    if tp_rank == 0:
        p = pipeline(dp_degree=G, dp_group_id=gid, world_size=G, global_rank=gid,
                     aggregate_dir=str(shared_tmp / "agg"), run_id="per-group", aggregate_timeout_s=60)
        it = iter(p)
        take_step_rows(it, 2 * C // G)
        state = p.checkpoint()
        p.close()
    states = [s for s in allgather(state) if s is not None]
    assert len(states) == G and all(s == states[0] for s in states)
    assert sorted(int(k) for k in states[0]["lanes"]) == list(range(C))
    dist.barrier()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("direction", ["fewer", "more"])
def test_elastic_restore_matches_uninterrupted(direction, gloo_pg, rank, world_size, allgather, shared_tmp):
    """Checkpoint on one number of ranks, restore on another (<= C), compare every step."""
    import torch.distributed as dist

    big = min(world_size, C)
    small = max(1, big // 2)
    first, second = (big, small) if direction == "fewer" else (small, big)
    B, steps_before, steps_after = C, 2, 3
    ref = reference_steps(steps_before + steps_after, B)
    agg = str(shared_tmp / "agg")

    def phase(G: int, run_id: str, state, steps: int):
        rows, new_state = None, None
        if rank < G:
            p = pipeline(dp_degree=G, dp_group_id=rank, world_size=G, global_rank=rank, aggregate_dir=agg, run_id=run_id, aggregate_timeout_s=60)
            if state is not None:
                p.restore(state)
            it = iter(p)
            rows = [take_step_rows(it, B // G) for _ in range(steps)]
            new_state = p.checkpoint()
            p.close()
        gathered = allgather((rows, new_state))
        per_step = [_flatten([g[0][s] for g in gathered if g[0] is not None]) for s in range(steps)]
        return per_step, next(g[1] for g in gathered if g[1] is not None)

    before, state = phase(first, "elastic-a", None, steps_before)
    after, _ = phase(second, "elastic-b", state, steps_after)
    got = before + after
    for step, (x, y) in enumerate(zip(got, ref)):
        assert x == y, f"global step {step} differs after resuming {first} -> {second} ranks"
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_missing_rank_is_named_by_the_leader(gloo_pg, rank, world_size, allgather, shared_tmp):
    import torch.distributed as dist

    skipper = world_size - 1
    p = pipeline(dp_degree=world_size if world_size <= C else 1, dp_group_id=rank if world_size <= C else 0,
                 world_size=world_size, global_rank=rank, aggregate_dir=str(shared_tmp / "agg"), run_id="missing", aggregate_timeout_s=2)
    outcome = "skipped"
    if rank != skipper:
        with pytest.raises(AggregationError) as err:
            p.checkpoint()
        outcome = str(err.value)
    outcomes = allgather(outcome)
    assert f"global rank(s) [{skipper}]" in outcomes[0], outcomes[0]
    for r in range(1, world_size - 1):
        assert "timed out" in outcomes[r] and f"global rank {r}" in outcomes[r], outcomes[r]
    dist.barrier()


@pytest.mark.mpi(min_size=4)
def test_run_wide_tokens_per_source_equal_the_sum_of_every_ranks_batches(gloo_pg, rank, world_size, allgather, shared_tmp):
    """No collective builds the run-wide figures: they are the merged state's lane tallies, on every rank."""
    G = 4 if world_size >= 4 else world_size
    if rank >= G:  # the figures are checked at dp=4: further ranks only take part in the test's collectives
        allgather(None)
        allgather(None)
        return
    opts = dict(world_size=G, global_rank=rank, aggregate_dir=str(shared_tmp / "agg-stats"), run_id="stats", aggregate_timeout_s=60)
    p = pipeline(dp_degree=G, dp_group_id=rank, prefetch=2, **opts)
    it = iter(p)
    mine = np.zeros(2, dtype=np.int64)
    for _ in range(5 * (2 * C) // G):  # five global steps of 2C batches
        b = next(it)
        np.add.at(mine, b.segments[:, 1], b.segments[:, 4] - b.segments[:, 3])
    p.checkpoint()
    s = p.stats()
    p.close()
    delivered = [m for m in allgather(mine.tolist()) if m is not None]
    run = [x for x in allgather([src.run_tokens for src in s.sources]) if x is not None]
    assert len(delivered) == G and all(r == run[0] for r in run), "ranks disagree on the run-wide figures"
    assert run[0] == np.sum(delivered, axis=0).tolist()
    assert [src.tokens for src in s.sources] == mine.tolist() and s.run_lanes == C
