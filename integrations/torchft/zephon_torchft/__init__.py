"""zephon_torchft: Zephon's live mode driven by a torchft ``Manager`` (docs/live_elasticity.md).

Replica groups leave and join a running job; every committed step keeps exactly its
samples. ``LiveData`` wires a ``zephon_core.live.LiveLanes`` to the Manager's quorum, its
fault-tolerant allreduce, its commit vote and its state transfer to healing groups.
"""

from zephon_torchft.live import LiveData, manager_problems

__all__ = ["LiveData", "manager_problems"]
