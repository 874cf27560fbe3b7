"""Only tensor-parallel rank 0 of each data-parallel group loads (and checkpoints) data.

Run with: torchrun --nproc-per-node 8 docs/examples/coordination_identity_per_dp_group.py
"""

from common import aggregate_dir, with_operators, work_source
from torch.distributed.device_mesh import init_device_mesh

from zephon_core import Pipeline

mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("dp", "tp"))
dp_mesh, tp_mesh = mesh["dp"], mesh["tp"]

if tp_mesh.get_local_rank() == 0:
    # The other tensor-parallel ranks receive batches by broadcast, so only
    # these four pipelines checkpoint: the data-parallel numbers serve as
    # both the data identity and the coordination identity.
    pipeline = with_operators(Pipeline(work_source())).options(
        dp_degree=dp_mesh.size(),
        dp_group_id=dp_mesh.get_local_rank(),
        world_size=dp_mesh.size(),
        global_rank=dp_mesh.get_local_rank(),
        aggregate_dir=aggregate_dir(),
        run_id="guide-per-dp-group",
    )
    it = iter(pipeline)
    next(it)
    state = pipeline.checkpoint()
    print(f"dp group {dp_mesh.get_local_rank()}: merged state of {len(state['lanes'])} lanes")
    pipeline.close()
