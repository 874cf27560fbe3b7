"""Every rank builds a Pipeline, so every rank takes part in checkpoints.

Run with: torchrun --nproc-per-node 8 docs/examples/coordination_identity.py
"""

import torch.distributed as dist
from common import aggregate_dir, with_operators, work_source

from zephon_core import Pipeline

if not dist.is_initialized():
    dist.init_process_group("gloo")

# Rank 0 merges everyone's progress through aggregate_dir; run_id keeps this
# job's files apart from other jobs that share the folder.
pipeline = with_operators(Pipeline(work_source())).options(
    world_size=dist.get_world_size(),
    global_rank=dist.get_rank(),
    aggregate_dir=aggregate_dir(),
    run_id="guide-coordination",
)
it = iter(pipeline)
next(it)
state = pipeline.checkpoint()  # every rank, same step; every rank gets the merged state
print(f"rank {dist.get_rank()}: checkpoint covers lanes {sorted(int(k) for k in state['lanes'])}")
pipeline.close()
