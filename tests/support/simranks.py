"""Many ranks in one process, for tests of checkpoint aggregation: each rank is a thread with its own
``Aggregator`` and its own local state, exactly as ``Pipeline.checkpoint()`` hands it over.

    ranks = SimRanks(str(tmp_path), "run", world_size=1024, dp=128, layout=mesh(tp=8))
    got = ranks.checkpoint(step=1)             # {rank: merged state or the exception it raised}
    ranks.checkpoint(step=2, absent={17})      # rank 17 never calls checkpoint()

The state of a rank at step ``k`` says every lane of its dp group delivered ``k`` batches, so a
merged state shows which step each lane came from. bench/goals/p4s_scale/aggregate_scale.py is the benchmark twin.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from zephon_core import MemorySource, Pipeline, StaticMixture
from zephon_core.batch import Cursor
from zephon_core.checkpoint.aggregate import Aggregator
from zephon_core.checkpoint.state import LaneState, make_state
from zephon_core.lane.assignment import owned_lanes


def mesh(tp: int = 1, cp: int = 1) -> Callable[[int, int], int]:
    """TorchTitan's layout (pp, dp, cp, tp; tp innermost): the dp group of global rank ``r`` of ``dp`` groups."""
    return lambda r, dp: (r // (cp * tp)) % dp


def definition() -> dict[str, Any]:
    src = MemorySource([[d * 10 + j for j in range(5)] for d in range(64)], name="sim")
    return Pipeline(StaticMixture([src], seed=3, chunk_size=4)).pack(8).batch(2).definition()


class SimRanks:
    def __init__(self, agg_dir: str, run_id: str, *, world_size: int, dp: int, layout: Callable[[int, int], int] | None = None,
                 lanes: int | None = None, timeout_s: float = 60.0, fan_in: int = 16, storage_options: Mapping[str, Any] | None = None) -> None:
        self.world_size, self.dp, self.lanes = world_size, dp, lanes or dp
        self.layout = layout or mesh(tp=world_size // dp)
        self.defn = definition()
        self.took: dict[int, float] = {}  # seconds each rank spent in its last checkpoint() call
        self.aggs = [Aggregator(agg_dir, run_id, world_size, r, timeout_s, dict(storage_options or {}), fan_in=fan_in) for r in range(world_size)]

    def set_timeout(self, timeout_s: float) -> None:
        """Every rank's ``aggregate_timeout_s`` from now on (a failing round need not wait as long as a first one takes)."""
        for a in self.aggs:
            a.me = dataclasses.replace(a.me, timeout_s=timeout_s)

    def group(self, rank: int) -> int:
        return self.layout(rank, self.dp)

    def state(self, rank: int, step: int, group: int | None = None) -> dict[str, Any]:
        g = self.group(rank) if group is None else group
        topo = {"dp_degree": self.dp, "dp_group_id": g, "world_size": self.world_size, "global_rank": rank}
        return make_state(self.defn, self.lanes, topo, {lane: LaneState(Cursor(step, 0, 0, 0), step) for lane in owned_lanes(self.lanes, self.dp, g)})

    def checkpoint(self, step: int, *, absent: Iterable[int] = (), states: Mapping[int, dict[str, Any]] | None = None,
                   delay: Mapping[int, float] | None = None, join_timeout: float = 300.0) -> dict[int, Any]:
        """Every rank not in ``absent`` calls checkpoint() at once (``delay``: that many seconds later); their results."""
        skip, states, delay = set(absent), dict(states or {}), dict(delay or {})
        self.took = {}
        out: dict[int, Any] = {}
        go = threading.Event()

        def run(r: int, st: dict[str, Any]) -> None:
            go.wait()
            if r in delay:
                time.sleep(delay[r])
            t = time.monotonic()
            try:
                out[r] = self.aggs[r].checkpoint(st)
            except Exception as e:  # handed back to the test
                out[r] = e
            self.took[r] = time.monotonic() - t

        threading.stack_size(512 * 1024)
        threads = [threading.Thread(target=run, args=(r, states.get(r) or self.state(r, step))) for r in range(self.world_size) if r not in skip]
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join(join_timeout)
        assert not any(t.is_alive() for t in threads), "a simulated rank is still running"
        return out

    def leader_s(self) -> float:
        """How long global rank 0 took in the last checkpoint: a measure of this machine's speed for the next one's timeout."""
        return self.took[0]
