"""``Pipeline``: the per-rank loader users build, iterate, checkpoint and restore."""

from __future__ import annotations

import difflib
import os
import queue
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from typing import Any

from zephon_core.batch import Batch, Cursor
from zephon_core.errors import ConfigError, StateError
from zephon_core.execution import DocOpRunner
from zephon_core.lane import LaneStream
from zephon_core.lanes import next_lane, owned_lanes
from zephon_core.mixture import StaticMixture
from zephon_core.ops import BatchOp, DocOp, FilterOp, MapOp, PackOp, ShuffleOp, TokenizeOp
from zephon_core.state import LaneState, diff_definitions, fingerprint_of, make_state, parse_lanes, verify_checksum

DEFAULT_AGGREGATE_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Options:
    """Everything set through ``Pipeline.options``; see its docstring."""

    dp_degree: int | None = None
    dp_group_id: int | None = None
    world_size: int = 1
    global_rank: int = 0
    canonical_replicas: int | None = None
    aggregate_dir: str | None = None
    run_id: str | None = None
    aggregate_timeout_s: float = DEFAULT_AGGREGATE_TIMEOUT_S
    storage_options: Mapping[str, Any] | None = field(default=None, hash=False)
    prefetch: int = 0
    readahead: int = 1
    reader_threads: int = 1
    pipelines_per_node: int | None = None


_OPTION_NAMES = tuple(f.name for f in fields(Options))


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"option {name} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"option {name} must be >= {minimum}, got {value}")


def validate_run_id(run_id: Any) -> str:
    """A run_id names one folder under aggregate_dir and must not escape it."""
    if not isinstance(run_id, str) or not run_id:
        raise ConfigError(f"option run_id must be a non-empty string, got {run_id!r}")
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    bad = sorted(set(run_id) - allowed)
    if bad or run_id in (".", "..") or run_id.startswith(".") or len(run_id) > 128:
        raise ConfigError(
            f"option run_id {run_id[:40]!r}{'...' if len(run_id) > 40 else ''} must be 1-128 characters of letters, digits, '.', '_' "
            "or '-', not start with '.', so it cannot escape aggregate_dir"
        )
    return run_id


@dataclass(frozen=True)
class Identity:
    """Resolved identities of one pipeline instance."""

    dp_degree: int
    dp_group_id: int
    world_size: int
    global_rank: int
    canonical_replicas: int

    @property
    def lanes(self) -> list[int]:
        return owned_lanes(self.canonical_replicas, self.dp_degree, self.dp_group_id)


def resolve_identity(opts: Options, canonical_replicas: int | None = None) -> Identity:
    """Defaults and validation of data and coordination identity."""
    _check_int("world_size", opts.world_size, 1)
    _check_int("global_rank", opts.global_rank, 0)
    if opts.global_rank >= opts.world_size:
        raise ConfigError(f"option global_rank={opts.global_rank} must be below world_size={opts.world_size}")
    dp_degree = opts.world_size if opts.dp_degree is None else opts.dp_degree
    dp_group_id = opts.global_rank if opts.dp_group_id is None else opts.dp_group_id
    _check_int("dp_degree", dp_degree, 1)
    _check_int("dp_group_id", dp_group_id, 0)
    if dp_group_id >= dp_degree:
        raise ConfigError(f"option dp_group_id={dp_group_id} must be below dp_degree={dp_degree}")
    if canonical_replicas is not None:
        C = canonical_replicas
    else:
        C = opts.canonical_replicas if opts.canonical_replicas is not None else dp_degree
    _check_int("canonical_replicas", C, 1)
    if dp_degree > C:
        raise ConfigError(
            f"dp_degree={dp_degree} exceeds canonical_replicas={C}: a run can never have more data-parallel groups than lanes; "
            "choose canonical_replicas for the largest dp_degree the run will reach"
        )
    if opts.world_size > 1:
        if not opts.aggregate_dir:
            raise ConfigError(f"world_size={opts.world_size} needs option aggregate_dir (a shared directory or object-store prefix) to checkpoint")
        if opts.run_id is None:
            raise ConfigError(f"world_size={opts.world_size} needs option run_id, unique to this training run")
    if opts.run_id is not None:
        validate_run_id(opts.run_id)
    if not isinstance(opts.aggregate_timeout_s, (int, float)) or isinstance(opts.aggregate_timeout_s, bool) or not opts.aggregate_timeout_s > 0:
        raise ConfigError(f"option aggregate_timeout_s must be a positive number, got {opts.aggregate_timeout_s!r}")
    _check_int("prefetch", opts.prefetch, 0)
    _check_int("readahead", opts.readahead, 0)
    _check_int("reader_threads", opts.reader_threads, 0)
    if opts.pipelines_per_node is not None:
        _check_int("pipelines_per_node", opts.pipelines_per_node, 1)
    return Identity(dp_degree, dp_group_id, opts.world_size, opts.global_rank, C)


class Pipeline:
    """A deterministic, checkpointable stream of training batches for one rank.

    Build it from a work source, add operators, set options, iterate::

        pipeline = (
            Pipeline(StaticMixture([JsonlSource("a.jsonl")], seed=1))
            .tokenize(tokenizer, eos_id=0)
            .pack(seq_len=2048)
            .shuffle(window=256)
            .batch(8)
            .options(dp_degree=4, dp_group_id=1, canonical_replicas=8)
        )
        for batch in pipeline: ...
        state = pipeline.checkpoint()   # collective when world_size > 1

    Builder methods return a new ``Pipeline``; the original is unchanged.
    """

    def __init__(self, work_source: StaticMixture, *, _ops: tuple[Any, ...] = (), _options: Options | None = None) -> None:
        if not isinstance(work_source, StaticMixture):
            raise ConfigError(f"Pipeline needs a work source such as StaticMixture, got {type(work_source).__name__}")
        self.work_source = work_source
        self._ops = _ops
        self._opts = _options or Options()
        self._identity = resolve_identity(self._opts)
        self._restored: dict[int, LaneState] | None = None
        self._engine: _Engine | None = None
        self._aggregator: Any = None
        self._lock = threading.Lock()
        if self._identity.canonical_replicas % self._identity.dp_degree:
            warnings.warn(
                f"canonical_replicas={self._identity.canonical_replicas} is not divisible by dp_degree={self._identity.dp_degree}: "
                "data-parallel groups own different numbers of lanes, which unbalances their load",
                RuntimeWarning,
                stacklevel=2,
            )

    # -- building -------------------------------------------------------------
    def _with(self, op: Any) -> Pipeline:
        kinds = [o.kind for o in self._ops]
        if "batch" in kinds:
            raise ConfigError(f"{op.kind}: no operator may follow batch")
        if isinstance(op, DocOp) and "pack" in kinds:
            raise ConfigError(f"{op.kind}: per-document operators must come before pack")
        if op.kind in ("pack", "shuffle", "batch") and op.kind in kinds:
            raise ConfigError(f"{op.kind}: may appear only once")
        if isinstance(op, ShuffleOp) and "pack" not in kinds:
            raise ConfigError("shuffle: shuffles packed rows, so it must come after pack")
        if isinstance(op, BatchOp) and "pack" not in kinds:
            raise ConfigError("batch: needs pack before it")
        return Pipeline(self.work_source, _ops=self._ops + (op,), _options=self._opts)

    def map(self, fn: Callable[[Any], Any], *, parallelism: int = 1, runner: str = "thread") -> Pipeline:
        """Transform each document with ``fn`` (deterministic, pure)."""
        return self._with(MapOp(parallelism, runner, fn=fn))

    def filter(self, fn: Callable[[Any], bool], *, parallelism: int = 1, runner: str = "thread") -> Pipeline:
        """Keep documents for which ``fn`` is true."""
        return self._with(FilterOp(parallelism, runner, fn=fn))

    def tokenize(self, tokenizer: Any, *, bos_id: int | None = None, eos_id: int | None = None, parallelism: int = 1, runner: str = "thread") -> Pipeline:
        """Text -> token ids with a ``tokenizers.Tokenizer`` (batch-encoded), an object with ``encode``, or a callable."""
        return self._with(TokenizeOp(parallelism, runner, tokenizer=tokenizer, bos_id=bos_id, eos_id=eos_id))

    def pack(self, seq_len: int, *, mode: str = "concat", pad_id: int = 0) -> Pipeline:
        """Rows of ``seq_len + 1`` tokens: ``"concat"`` splits freely, ``"pad"`` keeps documents whole and pads."""
        return self._with(PackOp(seq_len, mode, pad_id))

    def shuffle(self, window: int, *, seed: int = 0) -> Pipeline:
        """Permute packed rows within consecutive windows of ``window`` rows of a lane."""
        return self._with(ShuffleOp(window, seed))

    def batch(self, batch_size: int, *, drop_last: bool = True) -> Pipeline:
        """Group ``batch_size`` rows of one lane into a ``Batch``."""
        return self._with(BatchOp(batch_size, drop_last))

    def options(self, **kwargs: Any) -> Pipeline:
        """Set identities and execution options; unknown names are errors.

        Data identity: ``dp_degree``, ``dp_group_id`` (default ``world_size``,
        ``global_rank``). Coordination identity: ``world_size``,
        ``global_rank``, ``aggregate_dir``, ``run_id``, ``aggregate_timeout_s``
        (default 180), ``storage_options`` (fsspec, for ``aggregate_dir``).
        Lanes: ``canonical_replicas`` (default: the initial ``dp_degree``).
        Execution (never changes the data): ``reader_threads`` (default 1)
        read and run ``map``/``filter``/``tokenize`` on the next ``readahead``
        pieces of each lane in the background; ``prefetch`` batches (default 0)
        are also packed ahead by a thread of their own, which rarely pays: a
        batch is packed in well under a millisecond;
        ``pipelines_per_node`` for ``explain()`` (default ``LOCAL_WORLD_SIZE``).
        """
        for name in kwargs:
            if name not in _OPTION_NAMES:
                hint = difflib.get_close_matches(name, _OPTION_NAMES, n=1)
                raise ConfigError(f"unknown option {name!r}" + (f"; did you mean {hint[0]!r}?" if hint else ""))
        return Pipeline(self.work_source, _ops=self._ops, _options=replace(self._opts, **kwargs))

    # -- introspection --------------------------------------------------------
    @property
    def identity(self) -> Identity:
        return self._identity

    def definition(self) -> dict[str, Any]:
        """Everything that defines the data; its hash is the state's fingerprint."""
        return {"work_source": self.work_source.definition(), "ops": [op.definition() for op in self._ops]}

    def _parts(self) -> tuple[list[DocOp], PackOp, ShuffleOp | None, BatchOp]:
        by_kind = {op.kind: op for op in self._ops}
        if "pack" not in by_kind or "batch" not in by_kind:
            raise ConfigError("a pipeline needs .pack(seq_len) and .batch(n) before it can be iterated")
        return [op for op in self._ops if isinstance(op, DocOp)], by_kind["pack"], by_kind.get("shuffle"), by_kind["batch"]

    def explain(self, pipelines_per_node: int | None = None) -> str:
        """A readable plan: identities, lanes, operators, threads and processes."""
        from zephon_core.explain import render

        return render(self, pipelines_per_node)

    # -- running --------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        with self._lock:
            if self._engine is None:
                self._engine = _Engine(self, self._restored or {})
            return self._engine

    def close(self) -> None:
        """Stop background threads and pools; the pipeline cannot be iterated after."""
        if self._engine is not None:
            self._engine.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lane_states(self) -> dict[int, LaneState]:
        if self._engine is not None:
            return self._engine.lane_states()
        restored = self._restored or {}
        return {lane: restored.get(lane, LaneState(Cursor.start(), 0)) for lane in self._identity.lanes}

    def local_state(self) -> dict[str, Any]:
        """This pipeline's own lanes, without coordinating with other ranks."""
        ident = self._identity
        topology = {"dp_degree": ident.dp_degree, "dp_group_id": ident.dp_group_id, "world_size": ident.world_size, "global_rank": ident.global_rank}
        return make_state(self.definition(), ident.canonical_replicas, topology, self._lane_states())

    def checkpoint(self) -> dict[str, Any]:
        """The progress of delivered batches, as a JSON-serialisable dict.

        With ``world_size > 1`` this is collective: every pipeline counted in
        ``world_size`` must call it at the same step; rank 0 merges all lanes
        and every rank returns the identical merged state.
        """
        state = self.local_state()
        if self._identity.world_size == 1:
            return state
        if self._aggregator is None:
            from zephon_core.aggregate import Aggregator

            o = self._opts
            assert o.aggregate_dir is not None and o.run_id is not None
            self._aggregator = Aggregator(
                o.aggregate_dir, o.run_id, o.world_size, o.global_rank, float(o.aggregate_timeout_s), dict(o.storage_options or {})
            )
        return self._aggregator.checkpoint(state)

    def restore(self, state: Mapping[str, Any]) -> None:
        """Resume from a state returned by ``checkpoint()`` (on any ``dp_degree <= C``).

        Call it before iterating. The state is validated now; a state of
        different data, a different ``canonical_replicas`` or without this
        group's lanes is refused with a message naming the difference.
        """
        if self._engine is not None:
            raise StateError("restore() must be called before the pipeline is iterated")
        lanes = parse_lanes(state)
        C_state = state["canonical_replicas"]
        if self._opts.canonical_replicas is not None and self._opts.canonical_replicas != C_state:
            raise StateError(
                f"canonical_replicas differs: the checkpoint has {C_state}, this pipeline has {self._opts.canonical_replicas}; "
                "it is fixed for the life of a run"
            )
        ident = resolve_identity(self._opts, canonical_replicas=C_state)
        mine = self.definition()
        if state["fingerprint"] != fingerprint_of(mine):
            diffs = diff_definitions(state["definition"], mine)
            detail = "; ".join(diffs[:5]) + ("; ..." if len(diffs) > 5 else "")
            raise StateError(f"the checkpoint was taken with different data (checkpoint vs this pipeline): {detail}")
        missing = [lane for lane in ident.lanes if lane not in lanes]
        if missing:
            raise StateError(
                f"the state has no progress for lane(s) {missing} owned by dp_group_id={ident.dp_group_id} of {ident.dp_degree}; "
                "restore from the merged state (checkpoint() with world_size > 1, or merge_states)"
            )
        verify_checksum(state)
        self._identity = ident
        self._restored = {lane: lanes[lane] for lane in ident.lanes}


# Engines whose prefetch thread may still run. The thread is not a daemon: a daemon
# thread inside a native call (a tokenizer) when the interpreter finalizes is killed
# mid-call and aborts the process. At exit, before joining non-daemon threads, Python
# runs the hooks registered here (as concurrent.futures does): each engine is told to
# stop, and its thread ends after the batch it is producing.
_LIVE_ENGINES: weakref.WeakSet[_Engine] = weakref.WeakSet()


def _stop_engines_at_exit() -> None:
    for engine in list(_LIVE_ENGINES):
        engine._stop.set()


threading._register_atexit(_stop_engines_at_exit)  # type: ignore[attr-defined]


class _Engine:
    """Produces the group's batches (in a prefetch thread) and tracks delivery."""

    _END = object()

    def __init__(self, pipeline: Pipeline, restored: Mapping[int, LaneState]) -> None:
        doc_ops, pack, shuffle, batch = pipeline._parts()
        opts = pipeline._opts
        ident = pipeline._identity
        self.lanes = ident.lanes
        self._runner = DocOpRunner(doc_ops)
        self._reader = ThreadPoolExecutor(opts.reader_threads, thread_name_prefix="zephon-read") if opts.reader_threads else None
        start = {lane: restored.get(lane, LaneState(Cursor.start(), 0)) for lane in self.lanes}
        self._streams = {
            lane: LaneStream(
                lane, ident.canonical_replicas, pipeline.work_source, self._runner, pack, shuffle, batch,
                st.cursor, st.delivered, self._reader, opts.readahead,
            )
            for lane, st in start.items()
        }
        self._delivered = dict(start)
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
        produced = {lane: st.delivered for lane, st in self._delivered.items()}
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

    def __iter__(self) -> _Engine:
        return self

    def __next__(self) -> Batch:
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
        self._delivered[b.lane] = LaneState(b.cursor, b.lane_index + 1)
        return b

    def lane_states(self) -> dict[int, LaneState]:
        return dict(self._delivered)

    def close(self) -> None:
        self._stop.set()
        if self._reader is not None:
            self._reader.shutdown(wait=False, cancel_futures=True)
        self._runner.close()


def default_pipelines_per_node() -> int:
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1
