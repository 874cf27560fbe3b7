"""Live mode under a real torchft Manager: one replica group, its lighthouse in this process, three steps.

Start more processes like this one (another replica_id, the same lighthouse) and they share the lanes;
kill one and the others carry on with every committed step's samples intact (docs/live_elasticity.md).
Run with: python docs/examples/live_torchft.py
"""

from datetime import timedelta

import torch
from common import with_operators, work_source
from torch.distributed import TCPStore
from torchft import Manager
from torchft.coordination import LighthouseServer
from torchft.optim import OptimizerWrapper
from torchft.process_group import ProcessGroupGloo

from zephon_core import Pipeline
from zephon_core.live import LiveLanes
from zephon_torchft import LiveData

S, k, steps = 1, 1, 3  # data-parallel ranks per replica group, batches per lane per step
lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1)
store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
model = torch.nn.Embedding(30_000, 1)
optim = torch.optim.SGD(model.parameters(), lr=0.1)
manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), load_state_dict=model.load_state_dict,
                  state_dict=model.state_dict, min_replica_size=1, use_async_quorum=False, replica_id="0",
                  lighthouse_addr=lighthouse.address(), store_addr="127.0.0.1", store_port=store.port, rank=0,
                  world_size=1)
optimizer = OptimizerWrapper(manager, optim)


def loss_of(batch):
    ids = torch.zeros(2, 128, dtype=torch.long) if batch is None else torch.from_numpy(batch.input_ids)  # a pad
    return model(ids).mean()


pipeline = with_operators(Pipeline(work_source())).options(canonical_replicas=4, dp_degree=S, dp_group_id=0)
live = LiveLanes(pipeline, batches_per_lane=k)   # pipeline: dp_degree=S, dp_group_id=j
data = LiveData(live, manager, slots=S)          # refuses bad settings, registers the table
for _ in range(steps):
    optimizer.zero_grad()                        # torchft: start_quorum()
    step = data.begin()
    for batch, weight in step.microbatches():    # batch None: a pad (any batch of the shape), weight 0
        (loss_of(batch) * weight).backward()     # weight: P / (k x L), so the step trains on the mean
    data.exchange()
    data.settle(optimizer.step())                # torchft's OptimizerWrapper: should_commit()
    print(f"step {step.step}: lanes {list(step.plan.lanes)}, committed steps {live.step}")
state = live.checkpoint()                        # the durable state: restores on any data-parallel degree
print("durable state: lanes", sorted(state["lanes"]), "at", {lane["delivered"] for lane in state["lanes"].values()})
live.close()
manager.shutdown(wait=False)
lighthouse.shutdown()
