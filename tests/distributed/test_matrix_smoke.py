"""Smoke tests for the multi-rank test infrastructure itself (any N >= 1)."""

import os

import pytest


@pytest.mark.mpi
def test_allreduce_sum_of_rank_plus_one(gloo_pg, rank, world_size):
    import torch
    import torch.distributed as dist

    assert dist.get_rank() == rank and dist.get_world_size() == world_size
    t = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=gloo_pg)
    assert t.item() == world_size * (world_size + 1) // 2
    assert os.environ["RANK"] == str(rank) and os.environ["WORLD_SIZE"] == str(world_size)


@pytest.mark.mpi(min_size=2)
def test_broadcast_and_gather_across_ranks(gloo_pg, rank, world_size, allgather):
    import torch
    import torch.distributed as dist

    t = torch.full((3,), float(rank))
    dist.broadcast(t, src=world_size - 1)
    assert t.tolist() == [float(world_size - 1)] * 3
    assert allgather(rank * 10) == [r * 10 for r in range(world_size)]


@pytest.mark.mpi
def test_shared_tmp_is_one_directory(shared_tmp, rank, world_size, allgather, barrier):
    assert len(set(allgather(str(shared_tmp)))) == 1
    (shared_tmp / f"rank-{rank}").write_text(str(rank))
    barrier()
    assert sorted(p.name for p in shared_tmp.iterdir()) == sorted(f"rank-{r}" for r in range(world_size))
    assert {int(p.read_text()) for p in shared_tmp.iterdir()} == set(range(world_size))
    barrier()


@pytest.mark.mpi
def test_dist_env_supports_env_init(dist_env, rank, world_size):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size
    # the fixture destroys the group afterwards
