"""The start-up rules of the elastic guarantee, every broken one reported at once, worded in the
framework's own terms (``Terms``): ``topology_problems`` lists them, ``refuse`` raises them as one
``IntegrationError``; ``warn_unknown_step_size`` when a framework cannot tell the step size; ``unlogged_saves``:
a steered mixture's rule that every checkpoint falls on a logged step (``SaveClock``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from zephon_core.errors import IntegrationError


@dataclass(frozen=True)
class Terms:
    """A framework's names for what the topology rules talk about, so that each message says what to change."""

    dp: str  # what it calls the data-parallel degree, e.g. "data-parallel size"
    canonical_replicas: str  # where a user sets canonical_replicas, e.g. "--zephon-canonical-replicas"
    aggregate_dir: str  # where a user sets the aggregation folder
    run_id: str  # and the run id
    step: Callable[[int], str]  # batches per optimizer step -> how the framework computes them
    step_fix: Callable[[int, int], str]  # (canonical_replicas, batches per step) -> which setting to change, to what
    dp_detail: str = ""  # after the degree, e.g. " (dp_replicate x dp_shard)"
    # The terms for steps first..last of a batch-size schedule (its messages name those steps); None: no schedule.
    at: Callable[[int, int], Terms] | None = None


@dataclass(frozen=True)
class Topology:
    """The facts of a run that decide whether it stays inside the elastic guarantee."""

    dp_degree: int
    canonical_replicas: int | None  # None: not known yet
    batches_per_step: int | None  # over all data-parallel groups; None: not known
    world_size: int = 1  # pipelines that checkpoint together
    aggregate_dir: str | None = None
    run_id: str | None = None


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def topology_problems(t: Topology, terms: Terms) -> list[str]:
    """Every rule ``t`` breaks, one sentence each (empty when the run may start)."""
    out: list[str] = []
    C, dp = t.canonical_replicas, t.dp_degree
    if C is not None and C < 1:
        out.append(f"canonical_replicas={C} must be at least 1")
    elif C is not None and C % dp:
        out.append(
            f"canonical_replicas={C} is not divisible by the {terms.dp} {dp}{terms.dp_detail}: "
            f"each data-parallel group must own the same number of lanes; "
            f"run with a {terms.dp} among {divisors(C)}, or start a new run with "
            f"{terms.canonical_replicas} set to a multiple of {dp} (it cannot change during a run)"
        )
    elif C is not None and t.batches_per_step is not None and t.batches_per_step % C:
        out.append(
            f"one optimizer step consumes {terms.step(t.batches_per_step)}, "
            f"which is not a multiple of canonical_replicas={C}; "
            f"{terms.step_fix(C, t.batches_per_step)} so every step holds the same samples after a resize"
        )
    if t.world_size > 1 and (not t.aggregate_dir or not t.run_id):
        named = ((terms.aggregate_dir, t.aggregate_dir), (terms.run_id, t.run_id))
        missing = " and ".join(name for name, value in named if not value)
        out.append(
            f"{t.world_size} pipelines checkpoint together, merging their progress through a shared folder: "
            f"set {missing} "
            "(or [aggregate] dir and run_id in the recipe)"
        )
    return out


def next_multiple(value: int, of: int) -> int:
    """The smallest positive multiple of ``of`` that is at least ``value``."""
    return of * max(1, -(-value // of))


@dataclass(frozen=True)
class SaveClock:
    """When a steered run (mixing) logs and when it saves a checkpoint with the loader's state, in the framework's
    step numbers and setting names. The adapters hand ``MixingLoader.record_loss`` the per-source loss only at a
    logged step and keep what they accumulated since out of the state, so a checkpoint at a step that is not
    logged would resume without those steps' losses and decide otherwise than the uninterrupted run."""

    log_setting: str  # e.g. "metrics.log_freq"
    log_every: int  # a step is logged when it is a multiple of this
    every: tuple[tuple[str, int], ...] = ()  # (setting, N): a checkpoint at every multiple of N
    at: tuple[tuple[str, int, str], ...] = ()  # (what saves, step, the fix): a checkpoint at that step
    last: int | None = None  # the run's last step: no periodic checkpoint after it (None: unknown)
    first_logged: bool = False  # step 1 is logged too, whatever log_every (TorchTitan)
    step: str = "step"  # what the framework calls a step ("iteration")

    def logged(self, step: int) -> bool:
        return step % max(1, self.log_every) == 0 or (self.first_logged and step == 1)


def unlogged_saves(c: SaveClock) -> list[str]:
    """Every checkpoint of ``c`` that falls on a step it does not log, one sentence each (empty: all exact)."""
    F, out = max(1, c.log_every), []
    why = (f"which {c.log_setting} = {F} does not log: a steered mixture (mixing) resumed there would lose the "
           f"per-source loss of the {c.step}s since the last logged one and decide otherwise")
    for setting, n in c.every:
        # k*n mod F repeats within F multiples; the one after covers a first multiple that only step 1 rescues.
        bad = next((k * n for k in range(1, F + 2) if not c.logged(k * n)), None) if n > 0 else None
        if bad is not None and (c.last is None or bad <= c.last):
            out.append(f"{setting} = {n} saves a checkpoint at {c.step} {bad}, {why}; "
                       f"set {setting} to a multiple of {c.log_setting} (e.g. {next_multiple(n, F)})")
    out += [f"{what} saves a checkpoint at {c.step} {s}, {why}; {fix}" for what, s, fix in c.at if not c.logged(s)]
    return out


def refuse(problems: list[str], error: type[IntegrationError] = IntegrationError, *, rank: int | None = None) -> None:
    """Raise ``error`` naming every problem (nothing when there is none).

    ``rank``: this process's global rank when it is one of a launcher's processes (torchrun). Every rank
    refuses alike, so the message is said once, as a log line of rank 0, and the error raised also ends its
    process quietly: with status 1 and no traceback (``except IntegrationError`` still catches it).
    """
    if not problems:
        return
    message = f"zephon: {problems[0]}" if len(problems) == 1 else (
        "zephon: this run cannot start:\n" + "\n".join(f"  - {p}" for p in problems))
    if rank is None:
        raise error(message)
    if rank == 0:
        logging.getLogger("zephon").error(message)
    raise _quiet(error)(message)


#: Each error type's quiet twin, made once (``except`` clauses and tests compare types).
_QUIET: dict[type[IntegrationError], type[IntegrationError]] = {}


def _quiet(error: type[IntegrationError]) -> type[IntegrationError]:
    """``error`` that is also a ``SystemExit`` with status 1: Python ends the process on it without a traceback."""
    if error not in _QUIET:

        def __init__(self: SystemExit, message: str) -> None:
            error.__init__(self, message)
            self.code = 1

        namespace = {"__init__": __init__, "__module__": error.__module__}
        _QUIET[error] = type(error.__name__, (error, SystemExit), namespace)
    return _QUIET[error]


def warn_unknown_step_size(framework: str, how: str) -> None:
    """Say loudly, once per process, that the step-size rule could not be checked."""
    import warnings

    warnings.warn(
        f"zephon: {framework} did not tell the loader how many batches one optimizer step consumes, "
        "so the rule that it is "
        f"a multiple of canonical_replicas (needed for identical steps after a resize) is NOT checked; {how}",
        RuntimeWarning,
        stacklevel=3,
    )
