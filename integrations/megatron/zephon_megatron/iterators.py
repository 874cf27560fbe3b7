"""The iterators Megatron trains and evaluates from.

Training: one ``TrainStream`` per loading rank owns the rank's Pipeline. Megatron
keeps one data iterator per model chunk (one, or one per virtual pipeline stage
with ``--num-layers-per-virtual-pipeline-stage``); every chunk that consumes data
gets a ``ZephonTrainIterator`` reading the stream from its own position, so all
of them see the same micro-batches in the same order, and the Pipeline has one
state. The stream follows Megatron's batch-size schedule (``StepCounter``), so it
knows at any time which optimizer step it is in.

Evaluation: ``ZephonValidIterator`` (``--eval-iters`` batches per evaluation,
from the start of a held-out recipe every time) and ``ZephonValidSet``
(``--full-validation``: the whole held-out recipe every time; one per recipe
with ``--multiple-validation-sets``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from zephon_core import Batch, Pipeline
from zephon_core.integration import Audited, LoggedBatch, MixingLoader, audited, log_identity
from zephon_megatron import state as loader_state
from zephon_megatron.batches import BatchFormat, to_megatron, to_torch
from zephon_megatron.broadcast import MicroBatch
from zephon_megatron.schedule import StepCounter
from zephon_megatron.surgery import unpassed_batches
from zephon_megatron.validate import ZephonMegatronError


def global_rank() -> int:
    """This process's global rank (0 before ``torch.distributed`` is initialised)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def received_log() -> Audited[MicroBatch]:
    """The batch log (``zephon_core.integration.batch_log``) of this process's global rank for the micro-batches
    it receives from tensor-parallel rank 0 (``Audited.over`` each one; no log when ``ZEPHON_BATCH_LOG`` is unset):
    a line of each one's identity, with the run the sender named (``broadcast``) and this process's launch."""
    return audited((), global_rank(), batch_of=lambda mb: mb.meta)


def micro_batch(b: Batch, fmt: BatchFormat, *, audit: bool = True, run: str = "") -> MicroBatch:
    """Convert; ``audit`` attaches the batch's identity, of ``run`` (``run_fingerprint``; training batches only:
    peers log it)."""
    mb = MicroBatch(to_torch(to_megatron(b, fmt)))
    if mb.get("cu_seqlens") is None:
        dict.pop(mb, "cu_seqlens", None)
        dict.pop(mb, "max_seqlen", None)
    mb.meta = LoggedBatch.identity(b.lane, b.lane_index, b.digest, run) if audit else None
    return mb


def _copy(mb: MicroBatch) -> MicroBatch:
    """A dict of its own for each reader: Megatron's get_batch edits the dict it is given."""
    out = MicroBatch(dict.items(mb))
    out.meta = mb.meta
    return out


class TrainStream:
    """One loading rank's training micro-batches: one Pipeline, read by every model chunk that consumes data.

    ``pipeline``: a ``MixingLoader`` under ``--zephon-mixing`` (``zephon_megatron.steering``).
    ``saves``: this rank's Pipeline takes part in checkpoints (tensor-parallel rank 0 of
    the first pipeline stage, context-parallel rank 0). Megatron asks every first-stage
    tensor-parallel rank 0 for ``save_state()``, context-parallel peers included; those
    return None, and Megatron then writes nothing for them.
    """

    def __init__(self, pipeline: Pipeline | MixingLoader, fmt: BatchFormat, counter: StepCounter, *,
                 saves: bool) -> None:
        self.pipeline = pipeline
        self.fmt = fmt
        self.counter = counter
        self.saves = saves
        self.start_iteration = counter.iteration
        self.produced = 0  # micro-batches taken from the Pipeline by this launch
        self._readers: list[ZephonTrainIterator] = []
        self._buffer: deque[MicroBatch] = deque()  # taken, not yet read by every reader
        self._base = 0  # stream position of _buffer[0]
        built = pipeline.pipeline if isinstance(pipeline, MixingLoader) else pipeline
        self.identity = log_identity(built.definition())
        self._batches: Audited = audited(pipeline, global_rank(), identity=self.identity)  # iterated when first taken

    def reader(self) -> ZephonTrainIterator:
        """A new data iterator for one more model chunk."""
        r = ZephonTrainIterator(self)
        self._readers.append(r)
        return r

    def read(self, reader: ZephonTrainIterator) -> MicroBatch:
        while reader.position >= self._base + len(self._buffer):
            self._take()
        mb = self._buffer[reader.position - self._base]
        reader.position += 1
        while self._buffer and min(r.position for r in self._readers) > self._base:
            self._buffer.popleft()
            self._base += 1
        return _copy(mb) if len(self._readers) > 1 else mb

    def _take(self) -> None:
        b = next(self._batches)
        self._buffer.append(micro_batch(b, self.fmt, run=self.identity.run))
        self.produced += 1
        self.counter.count()

    @property
    def delivering(self) -> Pipeline:
        """The Pipeline delivering now: under ``--zephon-mixing``, the one built for the last decision."""
        return self.pipeline.pipeline if isinstance(self.pipeline, MixingLoader) else self.pipeline

    @property
    def iteration(self) -> int:
        """Optimizer steps completed, counting from the start of the run."""
        return self.counter.iteration

    def pass_skipped(self) -> bool:
        """Whether the next step is journaled as skipped (``zephon_megatron.surgery``); if so, this stream moves past
        it reading nothing, since its lanes leave its micro-batches out themselves."""
        if self.delivering.surgery.skip_at(self.counter.iteration + 1) is None:
            return False
        self._between_steps("skip")
        self.counter.pass_step()
        return True

    def _between_steps(self, what: str) -> None:
        behind = [r.position for r in self._readers if r.position != self.produced]
        if not self.counter.at_boundary or behind:
            raise RuntimeError(
                f"zephon: {what} in the middle of optimizer step {self.counter.iteration + 1} "
                f"({self.counter.into_step} of its {self.counter.step_size} micro-batches read on this rank"
                + (f", model chunks at {sorted({*behind, self.produced})}" if behind else "")
                + f"); the loader can only {what} between steps"
            )

    def save_state(self) -> dict[str, Any] | None:
        """The merged loader state between two steps (collective over the Pipelines that save), else None."""
        self._between_steps("save_state()")
        if not self.saves:
            return None
        state = self.pipeline.checkpoint()
        delivered = sum(v["delivered"] for v in state["lanes"].values())
        want = self.counter.delivered_total - unpassed_batches(self.delivering.surgery, self.iteration,
                                                              int(state["canonical_replicas"]))
        if delivered != want:
            raise RuntimeError(
                f"zephon: the merged loader state holds {delivered} micro-batches at iteration {self.iteration}, expected "
                f"{want} (consumed samples {self.counter.consumed_samples} / micro batch "
                f"{self.counter.schedule.micro_batch_size}); data-parallel ranks consumed different amounts"
            )
        return loader_state.encode(state, iteration=self.iteration,
                                   batches_per_step=self.counter.schedule.micro_batches(self.counter.consumed_samples))

    def close(self) -> None:
        """Stop the Pipeline's threads and close the audit log; no more micro-batches are read."""
        self.pipeline.close()
        self._batches.close()


class ZephonTrainIterator:
    """Megatron's external training iterator for one model chunk: ``next()`` gives one micro-batch dict.

    ``save_state()`` is called by Megatron's checkpoint hook after an optimizer
    step; on the Pipelines that coordinate it is collective over the
    data-parallel ranks.
    """

    def __init__(self, stream: TrainStream) -> None:
        self.stream = stream
        self.position = 0  # micro-batches this chunk has read in this launch

    def __iter__(self) -> ZephonTrainIterator:
        return self

    def __next__(self) -> MicroBatch:
        return self.stream.read(self)

    @property
    def iteration(self) -> int:
        return self.stream.iteration

    def save_state(self) -> dict[str, Any] | None:
        return self.stream.save_state()


def skip_step(iterators: Any, num_microbatches: int) -> None:
    """Consume one skipped step's micro-batches on every model chunk's iterator (``--iterations-to-skip``), unless
    the step is journaled as skipped: the lanes leave them out, nothing is read (``TrainStream.pass_skipped``)."""
    chunks = [it for it in (iterators if isinstance(iterators, list) else [iterators]) if it is not None]
    ours = [getattr(it, "iterable", it) for it in chunks]  # Megatron wraps each in a RerunDataIterator
    streams = {id(it.stream): it.stream for it in ours if isinstance(it, ZephonTrainIterator)}
    if any([s.pass_skipped() for s in streams.values()]):
        return
    for it in chunks:
        for _ in range(num_microbatches):
            next(it)


class ZephonValidIterator:
    """Megatron's external validation iterator over a held-out recipe.

    Every evaluation consumes ``per_evaluation`` micro-batches; after that many
    (or when the held-out data ends) the stream starts over, so every
    evaluation — before or after a resume — reads exactly the same batches.
    """

    def __init__(self, make_pipeline: Callable[[], Pipeline], fmt: BatchFormat, per_evaluation: int) -> None:
        self._make = make_pipeline
        self.fmt = fmt
        self.per_evaluation = max(1, per_evaluation)
        self._pipeline: Pipeline | None = None
        self._it: Iterator[Batch] | None = None
        self._n = 0

    def __iter__(self) -> ZephonValidIterator:
        return self

    def _restart(self) -> None:
        if self._pipeline is not None:
            self._pipeline.close()
        self._pipeline = self._make()
        self._it = iter(self._pipeline)
        self._n = 0

    def __next__(self) -> MicroBatch:
        if self._it is None or self._n >= self.per_evaluation:
            self._restart()
        assert self._it is not None
        try:
            b = next(self._it)
        except StopIteration:
            if self._n == 0:
                raise ZephonMegatronError("zephon: the held-out recipe yields no batch of this micro-batch size") from None
            self._restart()
            b = next(self._it)
        self._n += 1
        return micro_batch(b, self.fmt, audit=False)

    def save_state(self) -> None:  # validation has no state to keep
        return None

    def close(self) -> None:
        """Stop the held-out Pipeline being read, if any; a later ``next()`` starts the evaluation stream over."""
        if self._pipeline is not None:
            self._pipeline.close()
        self._pipeline, self._it = None, None


class ZephonValidSet:
    """One held-out recipe read to its end at every evaluation (``--full-validation``).

    ``len()`` is the number of evaluation iterations this rank needs to cover its
    share of the recipe (Megatron takes the maximum over the data-parallel ranks
    and stores it in ``args.eval_iters``). Every pass yields the recipe's batches,
    then padding up to ``eval_iters(index) x per_iteration`` micro-batches:
    copies of the last batch with an all-zero loss mask, which add nothing to the
    loss or to its token count. The loss of a set is therefore the token mean over
    exactly its batches, however many ranks share it.
    """

    def __init__(self, make_pipeline: Callable[[], Pipeline], fmt: BatchFormat, per_iteration: int, *,
                 eval_iters: Callable[[], int], name: str) -> None:
        self._make = make_pipeline
        self.fmt = fmt
        self.per_iteration = max(1, per_iteration)
        self._eval_iters = eval_iters
        self.name = name
        self._count: int | None = None

    def _batches(self) -> Iterator[Batch]:
        pipeline = self._make()
        try:
            yield from pipeline
        finally:
            pipeline.close()

    def __len__(self) -> int:
        if self._count is None:
            self._count = sum(1 for _ in self._batches())
            if self._count == 0:
                raise ZephonMegatronError(f"zephon: held-out recipe {self.name} yields no batch of this micro-batch size on this rank")
        return -(-self._count // self.per_iteration)

    def __iter__(self) -> Iterator[MicroBatch]:
        target = self._eval_iters() * self.per_iteration
        last: Batch | None = None
        n = 0
        for b in self._batches():
            if n == target:
                break
            last = b
            n += 1
            yield micro_batch(b, self.fmt, audit=False)
        while n < target and last is not None:
            pad = micro_batch(last, self.fmt, audit=False)
            pad["loss_mask"] = pad["loss_mask"] * 0
            n += 1
            yield pad

    def save_state(self) -> None:
        return None
