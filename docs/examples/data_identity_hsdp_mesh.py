"""Hybrid sharded data parallelism: two mesh dimensions, one data-parallel identity.

Run with: torchrun --nproc-per-node 8 docs/examples/data_identity_hsdp_mesh.py
"""

from common import with_operators, work_source
from torch.distributed.device_mesh import init_device_mesh

from zephon_core import Pipeline

mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
replicate, shard = mesh["dp_replicate"], mesh["dp_shard"]

# Replicas and shards both read different data, so they multiply into one
# data-parallel degree; the group id is the row-major index over the two.
pipeline = with_operators(Pipeline(work_source())).options(
    dp_degree=replicate.size() * shard.size(),
    dp_group_id=replicate.get_local_rank() * shard.size() + shard.get_local_rank(),
)
batch = next(iter(pipeline))
print(f"dp group {pipeline.identity.dp_group_id} of {pipeline.identity.dp_degree}: {batch.digest}")
pipeline.close()
