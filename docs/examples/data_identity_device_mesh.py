"""Data identity from the data-parallel sub-mesh (8 ranks: dp=4 x tp=2).

Run with: torchrun --nproc-per-node 8 docs/examples/data_identity_device_mesh.py
"""

from common import with_operators, work_source
from torch.distributed.device_mesh import init_device_mesh

from zephon_core import Pipeline

# Tensor parallelism of 2 over 8 ranks leaves 4 data-parallel groups; only the
# "dp" dimension decides which samples a rank reads.
mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("dp", "tp"))
dp_mesh = mesh["dp"]

pipeline = with_operators(Pipeline(work_source())).options(
    dp_degree=dp_mesh.size(),
    dp_group_id=dp_mesh.get_local_rank(),
)
batch = next(iter(pipeline))
print(f"dp group {dp_mesh.get_local_rank()}: first batch {batch.digest} from lane {batch.lane}")
pipeline.close()
