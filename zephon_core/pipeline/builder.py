"""``Pipeline``: the per-rank loader users build, iterate, checkpoint and restore."""

from __future__ import annotations

import difflib
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from zephon_core.batch import Batch, Cursor
from zephon_core.checkpoint.state import LaneState, fingerprint_of, make_state, parse_lanes, verify_checksum
from zephon_core.checkpoint.steering import Clock, clock_of
from zephon_core.checkpoint.surgery import SurgeryJournal, add_skips, skip_of, surgery_journal_of
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.errors import ConfigError, StateError
from zephon_core.lane.ops import BatchOp, DocOp, FilterOp, MapOp, Op, PackOp, ShuffleOp, TokenizeOp
from zephon_core.metrics import COUNTERS
from zephon_core.pipeline.engine import Engine, OperatorChain
from zephon_core.pipeline.options import OPTION_NAMES, Identity, Options, default_pipelines_per_node, resolve_identity
from zephon_core.pipeline.plan import Plan, render
from zephon_core.pipeline.resume import Verdict, last_read_chunk, resume_verdict
from zephon_core.pipeline.stats import PipelineStats, RunFigures, pipeline_stats, run_figures
from zephon_core.pipeline.surgery import first_unread_chunk, lane_quarantines, quarantine_of


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

    def __init__(self, work_source: WorkSource, *, _ops: tuple[Op, ...] = (), _options: Options | None = None) -> None:
        if not isinstance(work_source, WorkSource):
            raise ConfigError(f"Pipeline needs a work source such as StaticMixture, got {type(work_source).__name__}")
        self.work_source = work_source
        self._ops = _ops
        self._opts = _options or Options()
        self._identity = resolve_identity(self._opts)
        self._restored_all: dict[int, LaneState] | None = None  # every lane of the restored state
        self.surgery = SurgeryJournal()  # steps skipped: from the restored state and skip_steps()
        self.clock: Clock | None = None  # a steered run's controller clock, kept in its states (MixingLoader sets it)
        self._run: RunFigures | None = None  # the lanes of the last merged or restored state, summed
        self._waited_before = 0.0  # seconds waited in next() by the pipelines this one was switched from
        self._engine: Engine | None = None
        self._aggregator: Any = None
        self._lock = threading.Lock()
        _warn_if_uneven(self._identity, stacklevel=3)

    # -- building -------------------------------------------------------------
    def _with(self, op: Op) -> Pipeline:
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

    def pack(self, seq_len: int, *, mode: str = "concat", pad_id: int = 0, window: int | None = None, overlong: str = "split",
             max_docs_per_row: int = 0) -> Pipeline:
        """Rows of ``seq_len + 1`` tokens: ``"concat"`` splits freely, ``"pad"`` keeps documents whole and pads,
        ``"first_fit"`` / ``"best_fit"`` fit the documents of windows of ``window`` documents (default 1024) into
        rows, longer ones split into rows (``overlong="split"``) or cut to one (``"truncate"``, counted);
        ``max_docs_per_row`` (0: no limit) closes a row once it holds that many documents (docs/concepts.md)."""
        return self._with(PackOp(seq_len, mode, pad_id, window, overlong, max_docs_per_row))

    def shuffle(self, window: int, *, seed: int = 0) -> Pipeline:
        """Permute packed rows within consecutive windows of ``window`` rows of a lane."""
        return self._with(ShuffleOp(window, seed))

    def batch(self, batch_size: int, *, drop_last: bool = True) -> Pipeline:
        """Group ``batch_size`` rows of one lane into a ``Batch``."""
        return self._with(BatchOp(batch_size, drop_last))

    def options(self, **kwargs: Any) -> Pipeline:
        """Set identities, lanes, coordination and execution options; unknown names are errors.

        Each field of ``zephon_core.pipeline.Options`` is one keyword, documented
        there with its default: data identity ``dp_degree``/``dp_group_id``;
        ``canonical_replicas``; coordination identity ``world_size``,
        ``global_rank``, ``aggregate_dir``, ``run_id``, ``aggregate_timeout_s``,
        ``storage_options``; execution (never changes the data) ``reader_threads``,
        ``readahead``, ``prefetch``; and ``pipelines_per_node`` for ``explain()``.
        """
        for name in kwargs:
            if name not in OPTION_NAMES:
                hint = difflib.get_close_matches(name, OPTION_NAMES, n=1)
                raise ConfigError(f"unknown option {name!r}" + (f"; did you mean {hint[0]!r}?" if hint else ""))
        return Pipeline(self.work_source, _ops=self._ops, _options=replace(self._opts, **kwargs))

    # -- introspection --------------------------------------------------------
    @property
    def identity(self) -> Identity:
        return self._identity

    @property
    def operators(self) -> tuple[Op, ...]:
        """The operators, in order."""
        return self._ops

    def definition(self) -> dict[str, Any]:
        """Everything that defines the data; its hash is the state's fingerprint."""
        return {"work_source": self.work_source.definition(), "ops": [op.definition() for op in self._ops]}

    def _chain(self) -> OperatorChain:
        by_kind = {op.kind: op for op in self._ops}
        pack, shuffle, batch = by_kind.get("pack"), by_kind.get("shuffle"), by_kind.get("batch")
        if not isinstance(pack, PackOp) or not isinstance(batch, BatchOp):
            raise ConfigError("a pipeline needs .pack(seq_len) and .batch(n) before it can be iterated")
        assert shuffle is None or isinstance(shuffle, ShuffleOp)
        return OperatorChain([op for op in self._ops if isinstance(op, DocOp)], pack, shuffle, batch)

    def plan(self, pipelines_per_node: int | None = None) -> Plan:
        """What this pipeline will do, as data: identities, lanes, operators, threads and processes."""
        per_node = pipelines_per_node or self._opts.pipelines_per_node or default_pipelines_per_node()
        return Plan.of(self._identity, self._opts, self.work_source.describe(), self._ops, per_node)

    def explain(self, pipelines_per_node: int | None = None) -> str:
        """A readable plan: identities, lanes, operators, threads and processes."""
        return render(self.plan(pipelines_per_node))

    # -- running --------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        with self._lock:
            if self._engine is None:
                ident = self._identity
                self._engine = Engine(self._chain(), self.work_source, ident.lanes, ident.canonical_replicas,
                                      self._opts, self._restored(), self.surgery.skipper(),
                                      lane_quarantines(self.surgery, self.work_source, ident.lanes))
            return self._engine

    def engine_for(self, lanes: list[int], start: Mapping[int, LaneState]) -> Engine:
        """A fresh engine over ``lanes`` from ``start`` (live mode reassigns lanes at every step); the caller closes
        it."""
        C = self._identity.canonical_replicas
        return Engine(self._chain(), self.work_source, lanes, C, self._opts, start, self.surgery.skipper(),
                      lane_quarantines(self.surgery, self.work_source, lanes))

    def skip_steps(self, first: int, last: int, batches_per_step: int) -> None:
        """Leave out the data of global steps ``first..last`` (from 1; ``batches_per_step`` batches each, on every
        rank together): the lanes move past it as if it had trained, nothing of it is delivered, and the skip is
        journaled in every later state (``zephon_core.checkpoint.surgery``). Before iterating or at any step
        before ``first``; under ``surgery.add_skips``'s rule: the same skip journaled already is a no-op, one
        overlapping a journaled skip or of steps this pipeline's lanes already delivered is refused."""
        skip = skip_of(first, last, batches_per_step, self._identity.canonical_replicas)
        self.surgery = add_skips(self.surgery, [skip], self._lane_states(copy=False))
        if self._engine is not None:
            self._engine.skips = self.surgery.skipper()

    def quarantine(self, documents: Sequence[tuple[str, int]]) -> None:
        """Leave ``documents`` (source name, document number) out of every lane from the first chunk it has not
        begun to read (``pipeline.surgery``): each keeps its slot as an empty document, so every other document
        keeps its place. Before iterating, after ``restore`` of the merged state (every lane's position)."""
        if self._engine is not None:
            raise StateError("quarantine() must be called before the pipeline is iterated (after restore())")
        C = self._identity.canonical_replicas
        restored = self._restored_all or {}
        starts = tuple(first_unread_chunk(lane, restored[lane].cursor, C, self.work_source, self._chain)
                       if lane in restored else 0 for lane in range(C))
        self.surgery = self.surgery.with_quarantine(quarantine_of(documents, self.work_source, starts))

    def close(self) -> None:
        """Stop background threads and pools; the pipeline cannot be iterated after."""
        if self._engine is not None:
            self._engine.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lane_states(self, copy: bool = True) -> dict[int, LaneState]:
        if self._engine is not None:
            return self._engine.lane_states(copy)
        restored = self._restored()
        return {lane: restored.get(lane, LaneState(Cursor.start(), 0)) for lane in self._identity.lanes}

    def _restored(self) -> dict[int, LaneState]:
        """This group's lanes of the restored state (none before a restore)."""
        everyone = self._restored_all or {}
        return {lane: everyone[lane] for lane in self._identity.lanes if lane in everyone}

    def local_state(self) -> dict[str, Any]:
        """This pipeline's own lanes, without coordinating with other ranks."""
        return self._local_state(self._lane_states())

    def _local_state(self, lanes: Mapping[int, LaneState]) -> dict[str, Any]:
        ident = self._identity
        topology = {"dp_degree": ident.dp_degree, "dp_group_id": ident.dp_group_id, "world_size": ident.world_size, "global_rank": ident.global_rank}
        return make_state(self.definition(), ident.canonical_replicas, topology, lanes, self.surgery, self.clock)

    def checkpoint(self) -> dict[str, Any]:
        """The progress of delivered batches, as a JSON-serialisable dict.

        With ``world_size > 1`` this is collective: every pipeline counted in
        ``world_size`` must call it at the same step; rank 0 merges all lanes
        and every rank returns the identical merged state.
        """
        return self.checkpoint_of(self._lane_states())

    def checkpoint_of(self, lanes: Mapping[int, LaneState]) -> dict[str, Any]:
        """``checkpoint()`` of the given lane states of this pipeline's group (live mode's committed lanes), collective
        in the same way."""
        state = self._local_state(lanes)
        if self._identity.world_size == 1:
            self._run = run_figures(self.work_source, lanes)
            return state
        if self._aggregator is None:
            from zephon_core.checkpoint.aggregate import Aggregator

            o = self._opts
            assert o.aggregate_dir is not None and o.run_id is not None
            self._aggregator = Aggregator(
                o.aggregate_dir, o.run_id, o.world_size, o.global_rank, float(o.aggregate_timeout_s), dict(o.storage_options or {})
            )
        merged: dict[str, Any] = self._aggregator.checkpoint(state)
        self._run = run_figures(self.work_source, parse_lanes(merged))
        return merged

    def read_frontier(self) -> int:
        """One past the last global chunk the rows this pipeline's lanes delivered depend on (0: none yet).

        A function of the delivered positions alone (read-ahead and prefetch never count): a curriculum may
        change from this chunk on without changing anything delivered (``pipeline.resume``).
        """
        C = self._identity.canonical_replicas
        lanes = self._lane_states(copy=False)
        return max((last_read_chunk(lane, ls.cursor, C, self.work_source, self._chain) + 1
                    for lane, ls in lanes.items()), default=0)

    def with_work_source(self, work_source: WorkSource) -> Pipeline:
        """This pipeline's operators and options over another work source (not started, nothing restored)."""
        return Pipeline(work_source, _ops=self._ops, _options=self._opts)

    def switched(self, work_source: WorkSource) -> Pipeline:
        """A pipeline over ``work_source`` that continues from this one's delivered lanes; this one is closed.

        What was produced ahead (prefetch, read-ahead) is dropped and read again under ``work_source``. The
        new curriculum must differ only from a chunk no lane has read: else ``StateError`` (``restore``).
        """
        nxt = Pipeline(work_source, _ops=self._ops,
                       _options=replace(self._opts, canonical_replicas=self._identity.canonical_replicas))
        nxt._aggregator = self._aggregator  # the checkpoint rounds continue
        nxt.restore(self.local_state())
        nxt._run = self._run  # the run-wide figures of the last merged state still hold
        nxt._waited_before = self.waited_s()  # the caller's wait goes on counting: intervals never turn negative
        self.close()
        return nxt

    def stats(self) -> PipelineStats:
        """A snapshot of what this pipeline delivered and what it cost (``pipeline.stats``); reads no data.

        Per source: tokens, documents and epochs delivered by this pipeline's lanes and,
        as of the last ``checkpoint()`` or ``restore()``, by the whole run; each owned
        lane's stage; padding and truncation of the delivered rows; the process-wide
        execution counters (``zephon_core.metrics.COUNTER_NAMES``) and the seconds the caller
        waited in ``next()``. Cheap enough to call every step.
        """
        return pipeline_stats(self.work_source, self._identity.canonical_replicas, self._lane_states(copy=False), self._run,
                              COUNTERS.snapshot(), self.waited_s())

    def waited_s(self) -> float:
        """Seconds the caller has waited in ``next()``, the pipelines this one was ``switched`` from included."""
        return self._waited_before + (self._engine.waited_s if self._engine is not None else 0.0)

    def resume_verdict(self, state: Mapping[str, Any]) -> Verdict:
        """Whether ``restore(state)`` accepts this pipeline's data definition, and why (``pipeline.resume``).

        The same definition always; a curriculum with stages appended (or not
        yet started stages changed) when the state's lanes have read nothing
        from where the change starts.
        """
        return resume_verdict(state, parse_lanes(state), self.definition(), self.work_source, self._chain)

    def restore(self, state: Mapping[str, Any]) -> None:
        """Resume from a state returned by ``checkpoint()`` (on any ``dp_degree <= C``).

        Call it before iterating. The state is validated now; a state of
        different data (other than stages appended after its position: see
        ``resume_verdict``), a different ``canonical_replicas`` or without this
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
        if state["fingerprint"] != fingerprint_of(self.definition()):
            verdict = self.resume_verdict(state)
            if not verdict.accepted:
                raise StateError(verdict.message)
        missing = [lane for lane in ident.lanes if lane not in lanes]
        if missing:
            raise StateError(
                f"the state has no progress for lane(s) {missing} owned by dp_group_id={ident.dp_group_id} of {ident.dp_degree}; "
                "restore from the merged state (checkpoint() with world_size > 1, or merge_states)"
            )
        verify_checksum(state)
        _warn_if_uneven(ident, stacklevel=3)  # the adopted canonical_replicas may not divide this dp_degree
        self._identity = ident
        self._restored_all = lanes
        self.surgery = surgery_journal_of(state).union(self.surgery)
        self.clock = clock_of(state)
        self._run = run_figures(self.work_source, lanes)


def _warn_if_uneven(ident: Identity, stacklevel: int) -> None:
    """Warn when ``dp_degree`` does not divide ``canonical_replicas``: the run leaves the elastic guarantee."""
    C, G = ident.canonical_replicas, ident.dp_degree
    if C % G:
        warnings.warn(
            f"canonical_replicas={C} is not divisible by dp_degree={G}: data-parallel groups own different numbers of lanes, "
            f"which unbalances their load, and a global step no longer holds the same samples as on a dp_degree dividing {C}, "
            f"so steps after a resize differ; use a dp_degree among {[d for d in range(1, C + 1) if C % d == 0]}",
            RuntimeWarning,
            stacklevel=stacklevel,
        )
