"""Megatron's global-batch-size schedule, as the loader needs it.

Megatron decides each optimizer step's global batch from the samples consumed
before it (``update_num_microbatches(args.consumed_train_samples)``): constant
with ``--global-batch-size``, stepped with ``--step-batch-size-schedule``
(megatron-core >= 0.18), ramped with ``--rampup-batch-size`` (0.17; 0.18 and
later parse that flag but ignore it). ``BatchSchedule`` asks a private copy
of the calculator Megatron itself built, so the loader follows the schedule
Megatron runs, whichever flag produced it, without re-implementing it.

``StepCounter`` follows one data-parallel rank through that schedule micro-batch
by micro-batch: which step it is in, whether it stands between two steps, how
many samples the run has consumed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

_UNBOUNDED = 10**7  # steps looked at when neither the run's length nor the schedule's end is known


@dataclass(frozen=True)
class Segment:
    """Steps ``first``..``last`` (1-based, inclusive) all have a global batch of ``global_batch`` samples."""

    first: int
    last: int
    global_batch: int


class BatchSchedule:
    """The running global batch of each step as a function of the samples consumed before it."""

    def __init__(self, running_global_batch: Callable[[int], int], micro_batch_size: int, *, horizon: int | None) -> None:
        self._gbs = running_global_batch
        self.micro_batch_size = int(micro_batch_size)
        # From ``horizon`` consumed samples on, the global batch no longer changes
        # (None: unknown, so every step up to --train-iters is looked at).
        self.horizon = horizon

    @classmethod
    def constant(cls, global_batch_size: int, micro_batch_size: int) -> BatchSchedule:
        return cls(lambda _consumed: int(global_batch_size), micro_batch_size, horizon=0)

    @classmethod
    def from_calculator(cls, calculator: Any, micro_batch_size: int) -> BatchSchedule:
        """Follow a copy of a megatron-core num-microbatches calculator (the original is left alone)."""
        calc = copy.deepcopy(calculator)

        def running(consumed: int) -> int:
            calc.update(int(consumed), False)
            return int(calc.get_current_running_global_batch_size())

        return cls(running, micro_batch_size, horizon=_horizon(calc))

    @classmethod
    def from_megatron(cls, args: Any) -> BatchSchedule:
        """The schedule of this Megatron process (its global calculator, else one built from ``args``)."""
        calculator = megatron_calculator(args)
        if calculator is None:
            return cls.constant(int(args.global_batch_size), int(args.micro_batch_size))
        return cls.from_calculator(calculator, int(args.micro_batch_size))

    def global_batch(self, consumed_samples: int) -> int:
        """Samples in the step that starts after ``consumed_samples``."""
        return self._gbs(consumed_samples)

    def micro_batches(self, consumed_samples: int) -> int:
        """Micro-batches (over all data-parallel ranks) in the step that starts after ``consumed_samples``."""
        return self.global_batch(consumed_samples) // self.micro_batch_size

    @property
    def ramps(self) -> bool:
        return self.horizon != 0

    def segments(self, train_iters: int | None) -> Iterator[Segment]:
        """The schedule of a run of ``train_iters`` steps from the start, as runs of equal steps.

        ``train_iters`` None (a run sized in samples, not known yet): up to where the
        schedule stops changing.
        """
        if train_iters is None:
            train_iters = _UNBOUNDED
        consumed, step, first, previous = 0, 1, 1, None
        while step <= train_iters:
            g = self.global_batch(consumed)
            if previous is not None and g != previous:
                yield Segment(first, step - 1, previous)
                first = step
            previous = g
            if self.horizon is not None and consumed >= self.horizon:
                break  # constant from here on
            consumed += g
            step += 1
        if previous is not None:
            yield Segment(first, train_iters, previous)

    def first_break(self, multiple_of: int, train_iters: int | None) -> Segment | None:
        """The first run of steps whose global batch is not a multiple of ``multiple_of`` samples."""
        return next((s for s in self.segments(train_iters) if s.global_batch % multiple_of), None)


@dataclass(frozen=True)
class Steps:
    """What start-up needs of a run's schedule, read at once: whether the global batch changes, the first step's,
    and the runs of equal steps (empty when it is constant)."""

    ramps: bool
    first_global_batch: int
    runs: tuple[tuple[int, int, int], ...] = ()  # (first, last, global batch) of each run of equal steps

    @classmethod
    def of(cls, args: Any, schedule: BatchSchedule | None = None) -> Steps:
        """The steps of ``schedule`` (default: this Megatron process's, ``BatchSchedule.from_megatron``) up to
        ``--train-iters``."""
        schedule = schedule or BatchSchedule.from_megatron(args)
        runs: tuple[tuple[int, int, int], ...] = ()
        if schedule.ramps:
            segments = schedule.segments(getattr(args, "train_iters", None))
            runs = tuple((s.first, s.last, s.global_batch) for s in segments)
        return cls(schedule.ramps, schedule.global_batch(0), runs)


def _horizon(calc: Any) -> int | None:
    schedule = getattr(calc, "schedule", None)  # StepBatchsizeNumMicroBatchesCalculator (>= 0.18)
    if isinstance(schedule, list) and schedule:
        return int(schedule[-1][0])
    ramp = getattr(calc, "ramup_samples", None)  # RampupBatchsizeNumMicroBatchesCalculator (0.17)
    if isinstance(ramp, int):
        return ramp + 1
    if type(calc).__name__ == "ConstantNumMicroBatchesCalculator":
        return 0
    return None


def megatron_calculator(args: Any) -> Any:
    """Megatron's num-microbatches calculator: the process's own once initialised, else a new one from ``args``."""
    try:
        import megatron.core.num_microbatches_calculator as nmc
    except ImportError:
        return None
    existing = getattr(nmc, "_GLOBAL_NUM_MICROBATCHES_CALCULATOR", None)
    if existing is not None:
        return existing
    build = getattr(nmc, "_build_num_microbatches_calculator", None)
    if build is None:
        return None
    import inspect

    wanted = dict(rank=-1, rampup_batch_size=getattr(args, "rampup_batch_size", None),
                  global_batch_size=args.global_batch_size, micro_batch_size=args.micro_batch_size,
                  data_parallel_size=args.data_parallel_size,
                  decrease_batch_size_if_needed=bool(getattr(args, "decrease_batch_size_if_needed", False)),
                  step_batch_size_schedule=getattr(args, "step_batch_size_schedule", None),
                  seq_length=getattr(args, "seq_length", None))
    params = inspect.signature(build).parameters
    try:
        return build(**{k: v for k, v in wanted.items() if k in params})
    except (AssertionError, ValueError):
        return None  # Megatron refuses these sizes itself, with its own message


class StepCounter:
    """One data-parallel rank's place in the schedule, advanced one micro-batch at a time."""

    def __init__(self, schedule: BatchSchedule, dp: int, *, iteration: int, consumed_samples: int) -> None:
        self.schedule = schedule
        self.dp = dp
        self.iteration = iteration  # optimizer steps completed
        self.consumed_samples = consumed_samples  # over all data-parallel ranks, at the start of the current step
        self._size = self._per_rank()
        self._left = self._size

    def _per_rank(self) -> int:
        return max(1, self.schedule.micro_batches(self.consumed_samples) // self.dp)

    def count(self) -> None:
        """One more micro-batch read on this rank."""
        self._left -= 1
        if self._left == 0:
            self.consumed_samples += self.schedule.global_batch(self.consumed_samples)
            self.iteration += 1
            self._size = self._left = self._per_rank()

    def pass_step(self) -> None:
        """A whole step this rank reads nothing of (a journaled skip: the lanes leave its micro-batches out)."""
        self._left = 1
        self.count()

    @property
    def at_boundary(self) -> bool:
        """Between two optimizer steps (no step half read)."""
        return self._left == self._size

    @property
    def into_step(self) -> int:
        """Micro-batches already read of the current step."""
        return self._size - self._left

    @property
    def step_size(self) -> int:
        """Micro-batches per rank of the current step."""
        return self._size

    @property
    def delivered_total(self) -> int:
        """Micro-batches the run has consumed over all data-parallel ranks, at the start of the current step."""
        return self.consumed_samples // self.schedule.micro_batch_size
