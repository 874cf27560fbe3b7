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


@pytest.mark.mpi
def test_every_rank_reads_its_share_of_a_many_shard_s3_source(s3_endpoint, gloo_pg, rank, world_size, allgather):
    """A folder of gzipped shards on s3:// with a manifest: every rank builds its pipeline from one
    manifest read, and across ranks one epoch holds every document exactly once."""
    import gzip
    import json

    import torch.distributed as dist

    from zephon_core import JsonlSource, Pipeline, StaticMixture

    prefix = allgather(uuid.uuid4().hex)[0]
    n_shards, per = 9, 7
    if rank == 0:
        fs = s3_endpoint.filesystem()
        for k in range(n_shards):
            lines = "".join(json.dumps({"text": f"shard{k}-doc{j}"}) + "\n" for j in range(per + k % 3)).encode()
            fs.pipe_file(f"{s3_endpoint.bucket}/{prefix}/part-{k:03d}.jsonl.gz", gzip.compress(lines))
        from zephon_core.cli import main

        assert main(["index", s3_endpoint.url(prefix), "--storage-options", json.dumps(s3_endpoint.storage_options)]) == 0
    dist.barrier()
    src = JsonlSource(s3_endpoint.url(prefix), storage_options=s3_endpoint.storage_options)
    assert src.files.expanded and len(src.metas) == n_shards
    ws = StaticMixture([src], seed=4, chunk_size=2, exhausted="stop", block_size=3, block_window=2)
    C = 8 if 8 % world_size == 0 else world_size
    p = Pipeline(ws).map(lambda d: [ord(c) for c in d] + [0]).pack(6).batch(1, drop_last=False).options(
        dp_degree=world_size, dp_group_id=rank, canonical_replicas=C, prefetch=0)
    mine = [(s.document, s.start, s.stop) for b in p for row in b.provenance for s in row]
    p.close()
    everyone = [seg for part in allgather(mine) for seg in part]
    for d, text in enumerate(src.read(list(range(len(src))))):
        covered = sorted(t for doc, a, b in everyone if doc == d for t in range(a, b))
        assert covered == list(range(len(text) + 1)), f"document {d} delivered {covered}"
    dist.barrier()
