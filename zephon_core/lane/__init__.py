"""The lanes: ``canonical_replicas`` independent streams, each cut from every C-th chunk.

Stages in data-flow order: ``assignment`` (which lanes a group owns),
``chunks`` (a lane's chunk descriptors), ``reader`` + ``pieces`` + ``docops``
(reading documents and running per-document operators), ``packing`` + ``feed``
(rows of ``seq_len + 1`` tokens), ``window`` (in order or shuffled), ``stream``
(batches). ``ops`` defines the operators they execute.
"""

from zephon_core.lane.assignment import next_lane, owned_lanes
from zephon_core.lane.stream import LaneStream

__all__ = ["LaneStream", "next_lane", "owned_lanes"]
