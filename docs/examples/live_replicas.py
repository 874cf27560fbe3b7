"""Live mode by hand: three replica groups, one leaves mid-step, one joins, every committed step keeps its samples.

torchft does the quorum, the allreduce and the commit vote in a real run (zephon_torchft.LiveData);
here they are a sum and a flag, so the protocol is visible in one process.
Run with: python docs/examples/live_replicas.py
"""

from common import with_operators, work_source

from zephon_core import Pipeline
from zephon_core.live import LiveLanes
from zephon_core.live.simulate import reference_steps

C, K = 6, 1  # six lanes; each lane delivers one batch per optimizer step


def make(slots: int, slot: int) -> Pipeline:
    return with_operators(Pipeline(work_source())).options(canonical_replicas=C, dp_degree=slots, dp_group_id=slot,
                                                           prefetch=0)


def attempt(replicas: list[LiveLanes], committed: bool = True) -> list[tuple[int, int, str]]:
    """One step attempt: every replica cuts its lanes' batches, the tables are summed, all commit or none."""
    steps = [live.begin(len(replicas), index) for index, live in enumerate(replicas)]
    summed = sum(live.exchange() for live in replicas)  # torchft: manager.allreduce(table, SUM)
    for live in replicas:
        live.settle(summed, len(replicas), committed)  # torchft: should_commit()
    return sorted((b.lane, b.lane_index, b.digest) for s in steps for b in s.batches)


reference = reference_steps(make, C, K, 4)
replicas = [LiveLanes(make(1, 0), K) for _ in range(3)]
print("step 0 at 3 replicas matches:", attempt(replicas) == reference[0])
attempt(replicas, committed=False)  # a replica dies before the allreduce: nobody commits ...
replicas.pop().close()
print("step 1 retried at 2 replicas matches:", attempt(replicas) == reference[1])
joiner = LiveLanes(make(1, 0), K)
joiner.load_state_dict(replicas[0].state_dict())  # torchft's state transfer to a healing group
replicas.append(joiner)
print("step 2 with a joiner matches:", attempt(replicas) == reference[2])
print("committed steps:", [live.step for live in replicas])
for live in replicas:
    live.close()
