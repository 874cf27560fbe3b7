"""Running a pipeline: one ``LaneStream`` per owned lane, delivered in turns, optionally in a prefetch thread."""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from zephon_core.batch import Batch, Cursor
from zephon_core.checkpoint.state import LaneState
from zephon_core.checkpoint.surgery import LaneSkips
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.lane.assignment import next_lane
from zephon_core.lane.chunks import LaneQuarantine
from zephon_core.lane.docops import DocOpRunner
from zephon_core.lane.ops import BatchOp, DocOp, PackOp, ShuffleOp
from zephon_core.lane.stream import CutRecord, LaneStream
from zephon_core.metrics import Tally
from zephon_core.pipeline.options import Options
from zephon_core.pipeline.stats import lane_stage


class OperatorChain(NamedTuple):
    """A complete operator chain, split by the stage that runs each part."""

    doc_ops: list[DocOp]
    pack: PackOp
    shuffle: ShuffleOp | None
    batch: BatchOp


# Engines whose prefetch thread may still run. The thread is not a daemon: a daemon
# thread inside a native call (a tokenizer) when the interpreter finalizes is killed
# mid-call and aborts the process. At exit, before joining non-daemon threads, Python
# runs the hooks registered here (as concurrent.futures does): each engine is told to
# stop, and its thread ends after the batch it is producing.
_LIVE_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def _stop_engines_at_exit() -> None:
    for engine in list(_LIVE_ENGINES):
        engine._stop.set()


threading._register_atexit(_stop_engines_at_exit)  # type: ignore[attr-defined]


# Delivered batches a lane holds before counting them into its tally in one pass.
FOLD_AT = 512


class _LaneCount:
    """One lane's counting: batches already in its tally, the stage they count in, and where that stage ends."""

    __slots__ = ("counted", "stage", "bound")

    def __init__(self, counted: int) -> None:
        self.counted = counted  # the lane's batches before this one are in its tally
        self.stage = 0
        self.bound = 0  # no batch before the lane's cursor reaches this lane chunk can count in another stage


class Deliveries:
    """Per owned lane: the cursor, count and tally of the batches delivered to the caller.

    Recording a batch costs a few Python operations: what the delivered batches held is
    counted in bulk, from the lane stream's ``cut_log`` (one record per run of rows cut), when
    ``FOLD_AT`` of them have gathered, when the lane enters another stage, or when the tallies
    are read.
    """

    def __init__(self, start: Mapping[int, LaneState], work_source: WorkSource, C: int, width: int,
                 cut_logs: Mapping[int, deque[CutRecord]]) -> None:
        self._at = {lane: (st.cursor, st.delivered) for lane, st in start.items()}  # LaneState fields, built when asked
        self._tallies = {lane: st.tally.copy() if st.tally else Tally(since=st.delivered) for lane, st in start.items()}
        self._count = {lane: _LaneCount(st.delivered) for lane, st in start.items()}
        self._logs = cut_logs
        self.waited_s = 0.0  # seconds the caller spent inside next()
        self._work_source = work_source
        self._starts = work_source.stage_starts()
        self._C = C
        self._width = width  # tokens per row: seq_len + 1
        self._n_sources = len(work_source.sources)

    def delivered(self) -> dict[int, int]:
        return {lane: delivered for lane, (_, delivered) in self._at.items()}

    def record(self, b: Batch) -> None:
        """Note a batch handed to the caller, and mark it with its stage (kept lean: this runs for every batch)."""
        lane, cursor, index = b.lane, b.cursor, b.lane_index
        self._at[lane] = (cursor, index + 1)
        c = self._count[lane]
        if cursor.chunk >= c.bound:  # the lane may have reached another stage
            self._restage(lane, c, cursor, index)
        if index + 1 - c.counted >= FOLD_AT:
            self._fold(lane, index + 1)
        if c.stage:  # known only now, at delivery: the stream that cut the batch does not track stages
            object.__setattr__(b, "stage", c.stage)

    def _restage(self, lane: int, c: _LaneCount, cursor: Cursor, index: int) -> None:
        """The stage of the chunk the lane stands in (``Cursor.last_chunk``), and the lane chunk where the next begins."""
        stage = lane_stage(self._work_source, lane, cursor, self._C)
        if stage != c.stage:
            self._fold(lane, index)  # the batches before this one count in the stage before
            c.stage = stage
        nxt = self._starts[stage + 1] if stage + 1 < len(self._starts) else None
        c.bound = -(-(nxt - lane) // self._C) if nxt is not None else 1 << 62

    def _fold(self, lane: int, upto: int) -> None:
        """Count the lane's delivered batches ``counted .. upto - 1`` into its tally."""
        c, log = self._count[lane], self._logs[lane]
        tables, rows, k = [], 0, c.counted
        while k < upto:
            r = log[0]
            lo, hi = k - r.first, min(upto - r.first, r.batches)
            tables.append(r.table[r.bounds[lo] : r.bounds[hi]])
            rows += (hi - lo) * r.rows
            k = r.first + hi
            if hi == r.batches:
                log.popleft()
        tally = self._tallies[lane]
        tally.rows += rows
        tally.padding += rows * self._width  # less the tokens the segments fill (add_segments)
        tally.add_segments(tables, c.stage, self._n_sources)
        c.counted = upto

    def lane_states(self, copy: bool = True) -> dict[int, LaneState]:
        """The lanes after the last delivered batch; ``copy=False`` shares the live tallies (read them at once)."""
        out = {}
        for lane, (cursor, delivered) in self._at.items():
            self._fold(lane, delivered)
            tally = self._tallies[lane]
            out[lane] = LaneState(cursor, delivered, tally.copy() if copy else tally)
        return out


class Engine:
    """Produces a group's batches (in a prefetch thread, with ``prefetch > 0``) and tracks what was delivered.

    ``lane_states()`` are the lanes' positions after the last batch *delivered*
    to the caller, with their tallies: batches produced ahead never count.
    A batch whose lane number is in ``skips`` (steps skipped by surgery) is counted
    as delivered and not handed out; setting ``skips`` takes effect at the next batch.
    """

    _END = object()

    def __init__(self, chain: OperatorChain, work_source: WorkSource, lanes: list[int], canonical_replicas: int,
                 opts: Options, restored: Mapping[int, LaneState], skips: LaneSkips | None = None,
                 quarantines: Mapping[int, LaneQuarantine] | None = None) -> None:
        doc_ops, pack, shuffle, batch = chain
        self.skips = skips
        self.lanes = list(lanes)
        self._runner = DocOpRunner(doc_ops)
        self._reader = ThreadPoolExecutor(opts.reader_threads, thread_name_prefix="zephon-read") if opts.reader_threads else None
        start = {lane: restored.get(lane, LaneState(Cursor.start(), 0)) for lane in self.lanes}
        self._streams = {
            lane: LaneStream(
                lane, canonical_replicas, work_source, self._runner, pack, shuffle, batch,
                st.cursor, st.delivered, self._reader, opts.readahead, (quarantines or {}).get(lane),
            )
            for lane, st in start.items()
        }
        self._deliveries = Deliveries(start, work_source, canonical_replicas, pack.seq_len + 1,
                              {lane: stream.cut_log for lane, stream in self._streams.items()})
        self._stop = threading.Event()
        self._queue: queue.SimpleQueue[Any] | None = None
        self._gen = self._produce()
        prefetch = opts.prefetch
        if prefetch > 0:
            # Two C-level SimpleQueues: batches, and free slots bounding them to `prefetch`.
            # queue.Queue's Condition objects cost a Python-level notify/wait per batch.
            self._queue = queue.SimpleQueue()
            self._slots: queue.SimpleQueue[None] = queue.SimpleQueue()
            for _ in range(prefetch):
                self._slots.put(None)
            self._thread = threading.Thread(target=self._pump, name="zephon-prefetch")
            _LIVE_ENGINES.add(self)
            self._thread.start()

    def _produce(self) -> Iterator[Batch]:
        if len(self.lanes) == 1:  # the common case of C == G: no turns to take
            stream = self._streams[self.lanes[0]]
            while not self._stop.is_set():
                b = stream.next_batch()
                if b is None:
                    return
                yield b
            return
        produced = self._deliveries.delivered()
        live = set(self.lanes)
        while not self._stop.is_set():
            lane = next_lane(self.lanes, produced, live)
            if lane is None:
                return
            b = self._streams[lane].next_batch()
            if b is None:
                live.discard(lane)
                continue
            produced[lane] += 1
            yield b

    def _take_slot(self) -> bool:
        while not self._stop.is_set():
            try:
                self._slots.get(timeout=0.1)
                return True
            except queue.Empty:
                continue
        return False

    def _pump(self) -> None:
        assert self._queue is not None
        try:
            for b in self._gen:
                if not self._take_slot():
                    return
                self._queue.put(b)
            item: Any = self._END
        except BaseException as e:  # handed to the consumer, raised there
            item = e
        self._queue.put(item)

    def __iter__(self) -> Engine:
        return self

    def __next__(self) -> Batch:
        while True:
            b = self._take()
            if self.skips is None or b.lane_index not in self.skips:
                return b

    def _take(self) -> Batch:
        t0 = time.perf_counter()
        if self._queue is None:
            b = next(self._gen)
        else:
            while True:
                try:
                    item = self._queue.get(timeout=0.1)
                    break
                except queue.Empty:
                    if self._stop.is_set():  # closed: the producer will put nothing more
                        raise StopIteration from None
            if item is not self._END and not isinstance(item, BaseException):
                self._slots.put(None)
            if item is self._END:
                self._queue.put(item)
                raise StopIteration
            if isinstance(item, BaseException):
                self._queue.put(item)
                raise item
            b = item
        self._deliveries.waited_s += time.perf_counter() - t0
        self._deliveries.record(b)
        return b

    def lane_states(self, copy: bool = True) -> dict[int, LaneState]:
        return self._deliveries.lane_states(copy)

    @property
    def waited_s(self) -> float:
        """Seconds the caller has spent inside ``next()``."""
        return self._deliveries.waited_s

    def close(self) -> None:
        self._stop.set()
        if self._reader is not None:
            self._reader.shutdown(wait=False, cancel_futures=True)
        self._runner.close()
