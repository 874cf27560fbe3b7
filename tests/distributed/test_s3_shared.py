"""One moto S3 server (owned by rank 0) reachable from every rank."""

import os
import uuid

import pytest


@pytest.mark.mpi
def test_all_ranks_write_rank0_lists(s3_endpoint, gloo_pg, rank, world_size, allgather):
    import fsspec
    import torch.distributed as dist

    prefix = allgather(uuid.uuid4().hex)[0]  # one prefix for the whole job
    assert len(set(allgather(s3_endpoint.endpoint_url))) == 1
    assert os.environ["AWS_ENDPOINT_URL_S3"] == s3_endpoint.endpoint_url

    with fsspec.open(s3_endpoint.url(prefix, f"rank-{rank}.txt"), "w", **s3_endpoint) as f:
        f.write(f"hello from rank {rank}")
    dist.barrier()

    if rank == 0:
        fs = s3_endpoint.filesystem()
        listed = sorted(fs.ls(s3_endpoint.url(prefix), detail=False))
        assert listed == [f"{s3_endpoint.bucket}/{prefix}/rank-{r}.txt" for r in range(world_size)]
        assert [fs.cat(p).decode() for p in listed] == [f"hello from rank {r}" for r in range(world_size)]

    # env-only access (no storage options) reaches the same server from every rank
    fs_env = fsspec.filesystem("s3", skip_instance_cache=True)
    peer = (rank + 1) % world_size
    assert fs_env.cat(s3_endpoint.url(prefix, f"rank-{peer}.txt")).decode() == f"hello from rank {peer}"
    dist.barrier()
