"""``LiveLanes``: one replica group's slot of lanes under live membership (torchft), exact at every committed step.

Every replica group holds the committed table of its slot's lanes. At each step attempt the
participants split the slot (``plan_step``); a replica cuts ``batches_per_lane`` batches from
each lane it owns, starting at the lane's committed position, and after the step's backward
passes contributes its lanes' new positions to one SUM allreduce (``exchange``). Only when the
step commits does the table advance (``settle``); a discarded attempt consumes nothing: its
batches are served again if the assignment is unchanged, else the lanes seek back to the
table. A joining or healing group receives the table with the model (``state_dict`` /
``load_state_dict``), and the durable checkpoint is an ordinary Zephon state of all lanes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_core.batch import Batch
from zephon_core.checkpoint.state import LaneState, fingerprint_of, make_state, parse_lanes, verify_checksum
from zephon_core.checkpoint.surgery import surgery_journal_of
from zephon_core.errors import ConfigError, StateError
from zephon_core.live.plan import StepPlan, live_data_problems, plan_step
from zephon_core.live.table import TableCodec
from zephon_core.pipeline import Pipeline
from zephon_core.pipeline.engine import Engine
from zephon_core.pipeline.mixing import MixingLoader
from zephon_core.validation import require_int

TRANSFER_FORMAT = "zephon.live"


@dataclass(frozen=True)
class LiveStep:
    """One step attempt of one replica: its plan and the real batches it trains on (``plan.pads`` more are pads)."""

    step: int
    """Zephon's committed-step counter: the step this attempt would commit (0 first)."""
    plan: StepPlan
    batches: list[Batch]

    def microbatches(self) -> list[tuple[Batch | None, float]]:
        """The ``plan.microbatches`` micro-batches to run, each with the weight of its own loss: the real batches
        weighted ``plan.microbatch_weight``, then the pads (None: any batch of the same shape, its loss weighted 0).

        Backpropagate ``loss * weight`` for each: summed over the micro-batches and averaged by the framework's
        allreduce over the participants, the gradient is the mean over the step's real micro-batches at any
        membership. A loss already averaged over the step's micro-batches takes ``plan.loss_scale`` instead."""
        return [(b, self.plan.microbatch_weight) for b in self.batches] + [(None, 0.0)] * self.plan.pads


def _start_problems(pipeline: Any) -> list[str]:
    """What live mode refuses in the pipeline it is given: steering, and a journaled skip its lanes have not passed."""
    # A MixingLoader would steer; so would the pipeline one rebuilt for its decisions (a journaled mixture).
    if isinstance(pipeline, MixingLoader) or (isinstance(pipeline, Pipeline)
                                             and getattr(pipeline.work_source, "journal", None) is not None):
        return live_data_problems(mixing=True)
    if not isinstance(pipeline, Pipeline):
        return [f"LiveLanes needs a zephon_core.Pipeline, got {type(pipeline).__name__}"]
    behind = min((st.delivered for st in parse_lanes(pipeline.local_state()).values()), default=0)
    ahead = [skip for skip in pipeline.surgery.skips if skip.lane_batches().stop > behind]
    return live_data_problems(skip_ahead=str(ahead[0]) if ahead else None)


@dataclass(frozen=True)
class _Attempt:
    key: tuple[int, tuple[int, ...]]  # (step, lanes): the batches are reused for the same key
    batches: list[Batch]
    after: dict[int, LaneState]  # the owned lanes after these batches


class LiveLanes:
    """Live mode over ``pipeline``'s lanes: the slot that its ``dp_degree`` / ``dp_group_id`` select.

    ``batches_per_lane`` (``k``) is how many batches each lane delivers per optimizer step:
    a step is ``k x canonical_replicas`` batches over the whole job, and step ``s`` of lane
    ``l`` is its batches ``s*k .. s*k + k - 1`` whoever reads them. Restore the pipeline from
    a state taken at a step boundary before building this.
    """

    def __init__(self, pipeline: Pipeline, batches_per_lane: int) -> None:
        k = require_int(batches_per_lane, "live mode: batches_per_lane", 1)
        problems = _start_problems(pipeline)
        if problems:
            raise ConfigError("live mode: " + "; ".join(problems))
        ident = pipeline.identity
        if ident.canonical_replicas % ident.dp_degree:
            raise ConfigError(f"live mode: canonical_replicas={ident.canonical_replicas} must be divisible by the "
                              f"data-parallel ranks per replica group ({ident.dp_degree}): each serves an equal "
                              "slot of lanes")
        self._pipeline, self._k = pipeline, k
        ws = pipeline.work_source
        fingerprint = fingerprint_of(pipeline.definition())
        self._codec = TableCodec(ident.lanes, len(ws.stage_starts()), len(ws.sources), fingerprint, k)
        self._committed = parse_lanes(pipeline.local_state())  # decoded lanes of the committed table (or all of them)
        self._table: np.ndarray | None = None  # the last committed summed table, decoded lane by lane when needed
        self._sent: np.ndarray | None = None  # this replica's contribution to the current attempt's sum
        self._step = self._step_of(self._committed)
        self._engine: Engine | None = None
        self._engine_at: tuple[int, tuple[int, ...]] | None = None  # the step and lanes the engine stands at
        self._attempt: _Attempt | None = None
        self._participating = False  # whether this replica takes part in the current attempt (begin's index)

    @property
    def step(self) -> int:
        """Committed steps so far (Zephon's own counter: a discarded attempt does not count)."""
        return self._step

    @property
    def slot_lanes(self) -> list[int]:
        return list(self._codec.slot_lanes)

    @property
    def table_bytes(self) -> int:
        """Bytes each replica contributes to the per-step allreduce."""
        return self._codec.nbytes

    def committed(self) -> dict[int, LaneState]:
        """The slot's lanes as of the last committed step."""
        if self._table is not None and len(self._committed) < len(self._codec.slot_lanes):
            self._committed = self._codec.decode(self._table)
        return dict(self._committed)

    def _committed_lanes(self, lanes: tuple[int, ...]) -> dict[int, LaneState]:
        missing = [lane for lane in lanes if lane not in self._committed]
        if missing and self._table is not None:
            self._committed.update(self._codec.decode(self._table, missing))
        return {lane: self._committed[lane] for lane in lanes}

    def _step_of(self, lanes: Mapping[int, LaneState]) -> int:
        counts = {st.delivered for st in lanes.values()}
        if len(counts) != 1 or next(iter(counts)) % self._k:
            detail = ", ".join(f"lane {lane}: {st.delivered}" for lane, st in sorted(lanes.items())[:6])
            raise StateError(f"live mode needs every lane at the same step boundary ({self._k} batches per lane per "
                             f"step); the state's lanes delivered {detail}: restore a checkpoint taken at an "
                             "optimizer step")
        return next(iter(counts)) // self._k

    # -- one step --------------------------------------------------------------
    def begin(self, participants: int, index: int | None) -> LiveStep:
        """This replica's batches for the next step attempt, with ``participants`` replicas and this one at ``index``
        (None: not participating this step, e.g. healing; it runs pads only)."""
        plan = plan_step(self._codec.slot_lanes, participants, index, self._k)
        key = (self._step, plan.lanes)
        self._sent, self._participating = None, index is not None
        if self._attempt is None or self._attempt.key != key:
            self._attempt = _Attempt(key, *self._cut(plan.lanes))
        return LiveStep(self._step, plan, list(self._attempt.batches))

    def _cut(self, lanes: tuple[int, ...]) -> tuple[list[Batch], dict[int, LaneState]]:
        if not lanes:
            return [], {}
        if self._engine is None or self._engine_at != (self._step, lanes):
            self._close_engine()
            self._engine = self._pipeline.engine_for(list(lanes), self._committed_lanes(lanes))
        batches = []
        for _ in range(self._k * len(lanes)):
            b = next(self._engine, None)
            if b is None:
                raise ConfigError("live mode needs an endless recipe: a lane ran out of data within a step")
            batches.append(b)
        self._engine_at = (self._step + 1, lanes)
        return batches, self._engine.lane_states()

    def exchange(self) -> np.ndarray:
        """This replica's contribution to the step's SUM allreduce (int64, ``table_bytes``); zeros if not
        participating."""
        if self._attempt is None:
            raise StateError("live mode: exchange() before begin()")
        if not self._participating:
            return np.zeros((1 + len(self._codec.slot_lanes), self._codec.width), dtype=np.int64)
        self._sent = self._codec.encode(self._step, self._attempt.after)
        return self._sent.copy()

    def problems(self, summed: np.ndarray, participants: int) -> list[str]:
        """Why the summed table cannot be committed (replicas disagree); empty when it can. Check before committing.

        A replica that did not take part learns the step it heals to only at the commit: ``settle`` checks it then."""
        if self._attempt is not None and not self._participating:
            return []
        return self._codec.problems(np.asarray(summed), participants, self._step)

    def settle(self, summed: np.ndarray, participants: int, committed: bool) -> bool:
        """End the attempt: adopt the summed table when the step committed (returns True), else keep the table."""
        if not committed:
            return False
        summed = np.asarray(summed)
        problems = self._codec.problems(summed, participants, self._step)
        if problems:
            raise StateError(problems[0])
        late = self._codec.late(summed, (self._step + 1) * self._k)
        if late:
            raise StateError(f"live table: lane(s) {late[:8]} are not at step {self._step + 1} after the commit")
        attempt = self._attempt
        if attempt is not None and self._sent is not None:  # sent only by a replica that took part
            differ = self._codec.moved(summed, self._sent, list(attempt.after))
            if differ:
                raise StateError(f"live table: lane(s) {differ} came back at other positions than this replica "
                                 "delivered")
        self._table, self._committed, self._sent = summed.copy(), {}, None
        self._step, self._attempt = self._step + 1, None
        return True

    # -- state transfer and the durable checkpoint -----------------------------
    def _slot_state(self) -> dict[str, Any]:
        ident = self._pipeline.identity
        topology = {"dp_degree": ident.dp_degree, "dp_group_id": ident.dp_group_id, "live_step": self._step}
        return make_state(self._pipeline.definition(), ident.canonical_replicas, topology, self.committed(),
                          self._pipeline.surgery)

    def state_dict(self) -> dict[str, Any]:
        """The committed table for a joining or healing replica group (torchft's ``register_state_dict_fn``)."""
        return {"format": TRANSFER_FORMAT, "step": self._step, "state": json.dumps(self._slot_state(), sort_keys=True)}

    def load_state_dict(self, value: Mapping[str, Any]) -> None:
        """Adopt a peer's committed table (what ``state_dict`` of the same slot returned), with its surgery journal."""
        keys = {"format", "step", "state"}
        if not isinstance(value, Mapping) or value.get("format") != TRANSFER_FORMAT or set(value) != keys:
            raise StateError(f"live mode: the transferred state is not a {TRANSFER_FORMAT!r} table (keys: "
                             f"{sorted(value) if isinstance(value, Mapping) else type(value).__name__})")
        try:
            state = json.loads(value["state"])
        except (TypeError, json.JSONDecodeError) as e:
            raise StateError(f"live mode: the transferred table is not valid JSON ({e})") from None
        lanes = parse_lanes(state)
        verify_checksum(state)
        if state["fingerprint"] != fingerprint_of(self._pipeline.definition()):
            raise StateError("live mode: the peer's table is of another data definition (fingerprint): every "
                             "replica group must build the same recipe, tokenizer, seq_len and batch size")
        missing = [lane for lane in self._codec.slot_lanes if lane not in lanes]
        if missing:
            raise StateError(f"live mode: the peer's table lacks lane(s) {missing[:8]} of this slot: it came from "
                             "another data-parallel rank")
        slot = {lane: lanes[lane] for lane in self._codec.slot_lanes}
        step = self._step_of(slot)
        if step != value["step"]:
            raise StateError(f"live mode: the peer's table is at step {step}, its header says {value['step']!r}")
        self._close_engine()
        # The peer's surgery journal too (a quarantine its durable checkpoint journaled): the lanes apply it, and a
        # group that started from another checkpoint would otherwise cut other batches from the same positions.
        self._pipeline.surgery = surgery_journal_of(state)
        self._committed, self._table, self._sent, self._step, self._attempt = slot, None, None, step, None

    def checkpoint(self) -> dict[str, Any]:
        """The durable state of the committed lanes (collective over the pipeline's coordination group, as
        ``Pipeline.checkpoint``); it restores offline on any data-parallel degree."""
        return self._pipeline.checkpoint_of(self.committed())

    def _close_engine(self) -> None:
        if self._engine is not None:
            self._engine.close()
        self._engine, self._engine_at = None, None

    def close(self) -> None:
        """Stop the current lanes' threads."""
        self._close_engine()
