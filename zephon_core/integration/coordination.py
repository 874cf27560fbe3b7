"""What every training-framework adapter needs from the core, in one place.

An adapter translates framework facts (mesh sizes, batch sizes, its own flag
names) into these calls and nothing more:

* ``load_training_recipe``: a data recipe for a framework, which supplies the
  tokenizer, sequence length and batch size itself (so ``[standalone]`` is refused);
* ``resolve_coordination``: ``canonical_replicas``, the aggregation folder,
  ``run_id`` and timeout, from the adapter's options, the recipe, a resumed
  state and the data-parallel degree, in that order of precedence
  (``resolve_canonical_replicas``: the lanes alone, also before a resumed state is read);
* ``pipeline_options``: the ``Pipeline.options`` of one pipeline, from the resolved
  coordination and its data and coordination identity;
* ``topology_problems`` / ``refuse``: the start-up rules of the elastic
  guarantee, every broken one reported at once, worded in the framework's terms;
* ``IntegrationError``: the one error type of an adapter's refusals;
* ``bundled_configs``: the bundled ``configs/`` folder, from a clone or an installed wheel;
* ``IntervalMetrics``: ``Pipeline.stats()`` turned into what a framework's own logger shows
  every logging interval (``zephon/...`` scalars and one console line).
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_core.errors import ConfigError
from zephon_core.metrics import COUNTER_NAMES, COUNTERS
from zephon_core.pipeline.stats import PipelineStats
from zephon_core.recipe import Recipe, load_recipe


class IntegrationError(ConfigError):
    """A training run an adapter refuses to start, or a loader state it cannot use."""


def bundled_configs() -> Path:
    """The bundled ``configs/`` (recipes, demo corpus and tokenizer, job files): the clone's when this
    ``zephon_core`` runs from one, else the copy an installed wheel carries as the package ``zephon_configs``."""
    checkout = Path(__file__).resolve().parents[1] / "configs"
    if (checkout / "data" / "demo.toml").is_file():
        return checkout
    spec = importlib.util.find_spec("zephon_configs")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / "data" / "demo.toml").is_file():
            return Path(location)
    raise ConfigError("the bundled configs are missing from this installation of zephon-suite; reinstall it")


def load_training_recipe(path: str | os.PathLike[str], *, framework: str, role: str = "a training recipe",
                         error: type[IntegrationError] = IntegrationError) -> Recipe:
    """The recipe at ``path``, refused (as ``error``) if it has a ``[standalone]`` section: the framework supplies those values."""
    if not str(path):
        raise error("zephon: no data recipe given; pass recipe=<path to a TOML data recipe>")
    recipe = load_recipe(path)
    if recipe.spec.standalone is not None:
        raise error(
            f"{path}: standalone: {framework} supplies the tokenizer, sequence length and batch size; "
            f"remove the [standalone] section from a recipe used as {role}"
        )
    return recipe


@dataclass(frozen=True)
class Coordination:
    """How this run's pipelines checkpoint together, resolved from every place it can be set."""

    canonical_replicas: int
    aggregate_dir: str | None
    run_id: str | None
    aggregate_timeout_s: float


def resolve_coordination(
    recipe: Recipe,
    *,
    dp_degree: int,
    canonical_replicas: int | None = None,
    aggregate_dir: str | None = None,
    run_id: str | None = None,
    aggregate_timeout_s: float | None = None,
    resumed_state: Mapping[str, Any] | None = None,
) -> Coordination:
    """Adapter options (None or empty: unset) win over the recipe; ``canonical_replicas`` then
    falls back to a resumed state's, then to ``dp_degree`` (the first run's)."""
    spec = recipe.spec
    lanes = resolve_canonical_replicas(recipe, dp_degree=dp_degree, setting=canonical_replicas, resumed_state=resumed_state)
    folder = aggregate_dir or (recipe.resolve(spec.aggregate.dir) if spec.aggregate.dir else None)
    return Coordination(
        canonical_replicas=lanes or dp_degree,
        aggregate_dir=folder,
        run_id=run_id or spec.aggregate.run_id,
        aggregate_timeout_s=float(aggregate_timeout_s or spec.aggregate.timeout_s),
    )


def resolve_canonical_replicas(recipe: Recipe, *, dp_degree: int, setting: int | None = None,
                               resumed_state: Mapping[str, Any] | None = None, resuming: bool = False) -> int | None:
    """The run's lanes: the adapter's ``setting`` (None or 0: unset), else the recipe's, else a resumed
    state's, else ``dp_degree`` (the first run's); None while they are unknown (``resuming``: the run
    resumes from a state not read yet)."""
    lanes = setting or recipe.spec.canonical_replicas
    if not lanes and resumed_state is not None:
        lanes = int(resumed_state["canonical_replicas"])
    if not lanes and resuming:
        return None
    return int(lanes or dp_degree)


def pipeline_options(coordination: Coordination, *, dp_degree: int, dp_group_id: int, world_size: int = 1,
                     global_rank: int = 0) -> dict[str, Any]:
    """``Pipeline.options`` for one pipeline: its data identity and lanes, and, when several pipelines
    checkpoint together (``world_size > 1``), its coordination identity and how they merge their progress.

    With ``world_size == 1`` the aggregation settings are left to the recipe's own defaults: a lone
    pipeline never merges with another.
    """
    options: dict[str, Any] = dict(dp_degree=dp_degree, dp_group_id=dp_group_id,
                                   canonical_replicas=coordination.canonical_replicas)
    if world_size > 1:
        options.update(world_size=world_size, global_rank=global_rank, aggregate_dir=coordination.aggregate_dir,
                       run_id=coordination.run_id, aggregate_timeout_s=coordination.aggregate_timeout_s)
    return options


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
            f"canonical_replicas={C} is not divisible by the {terms.dp} {dp}{terms.dp_detail}: each data-parallel group must own "
            f"the same number of lanes; run with a {terms.dp} among {divisors(C)}, or start a new run with "
            f"{terms.canonical_replicas} set to a multiple of {dp} (it cannot change during a run)"
        )
    elif C is not None and t.batches_per_step is not None and t.batches_per_step % C:
        out.append(
            f"one optimizer step consumes {terms.step(t.batches_per_step)}, which is not a multiple of canonical_replicas={C}; "
            f"{terms.step_fix(C, t.batches_per_step)} so every step holds the same samples after a resize"
        )
    if t.world_size > 1 and (not t.aggregate_dir or not t.run_id):
        missing = " and ".join(name for name, value in ((terms.aggregate_dir, t.aggregate_dir), (terms.run_id, t.run_id)) if not value)
        out.append(
            f"{t.world_size} pipelines checkpoint together, merging their progress through a shared folder: set {missing} "
            "(or [aggregate] dir and run_id in the recipe)"
        )
    return out


def next_multiple(value: int, of: int) -> int:
    """The smallest positive multiple of ``of`` that is at least ``value``."""
    return of * max(1, -(-value // of))


def refuse(problems: list[str], error: type[IntegrationError] = IntegrationError) -> None:
    """Raise ``error`` naming every problem (nothing when there is none)."""
    if len(problems) == 1:
        raise error(f"zephon: {problems[0]}")
    if problems:
        raise error("zephon: this run cannot start:\n" + "\n".join(f"  - {p}" for p in problems))


def warn_unknown_step_size(framework: str, how: str) -> None:
    """Say loudly, once per process, that the step-size rule could not be checked."""
    import warnings

    warnings.warn(
        f"zephon: {framework} did not tell the loader how many batches one optimizer step consumes, so the rule that it is "
        f"a multiple of canonical_replicas (needed for identical steps after a resize) is NOT checked; {how}",
        RuntimeWarning,
        stacklevel=3,
    )


@dataclass(frozen=True)
class LoggedFigures:
    """One logging interval's figures: ``scalars`` for the framework's metric writers, ``line`` for its console."""

    scalars: dict[str, float]
    line: str


class IntervalMetrics:
    """What an adapter logs for Zephon every logging interval, from ``Pipeline.stats()`` snapshots.

    ``take(stats)`` returns, under ``prefix``:

    * the snapshot's own scalars (``PipelineStats.scalars``: per source tokens, documents and
      epochs, the ``run/...`` figures, stage, batches, padding and truncation fractions), which
      are cumulative, as a dashboard plots them;
    * in place of the process-wide execution counters, which only ever grow, what they grew by
      since the previous ``take`` (the first one: since this object was made):
      ``interval/<counter>`` for every ``zephon_core.metrics.COUNTER_NAMES`` entry and for the
      pipeline's ``wait_s``, plus ``interval/seconds`` (wall time of the interval) and ``interval/wait_fraction`` (the
      share of it the training loop spent waiting for batches).

    One object per logging rank; making it reads the counters, never the pipeline.
    """

    def __init__(self, prefix: str = "zephon/", clock: Callable[[], float] = time.perf_counter) -> None:
        self.prefix = prefix
        self._clock = clock
        self._since = clock()
        self._counters = COUNTERS.snapshot()
        self._waited = 0.0  # the pipeline's wait_s at the previous take

    def take(self, stats: PipelineStats) -> LoggedFigures:
        """The figures of the interval that ends now."""
        now = self._clock()
        seconds = max(now - self._since, 0.0)
        grew = {name: float(stats.counters[name]) - self._counters.get(name, 0.0) for name in COUNTER_NAMES}
        self._since, self._counters = now, {name: float(stats.counters[name]) for name in COUNTER_NAMES}
        p = self.prefix
        cumulative = {*COUNTER_NAMES, "wait_s"}
        scalars = {name: value for name, value in stats.scalars(p).items() if name[len(p):] not in cumulative}
        scalars.update({f"{p}interval/{name}": value for name, value in grew.items()})
        waited = stats.wait_s - self._waited
        self._waited = stats.wait_s
        scalars[f"{p}interval/wait_s"] = waited
        scalars[f"{p}interval/seconds"] = seconds
        scalars[f"{p}interval/wait_fraction"] = waited / seconds if seconds > 0 else 0.0
        return LoggedFigures(scalars, console_line(stats, waited, seconds))


def console_line(stats: PipelineStats, waited_s: float, seconds: float) -> str:
    """One line for a training log: stage, waiting, tokens per source (and their run share), padding."""
    waited = f"waited {waited_s:.3f} s of {seconds:.2f} s"
    if seconds > 0:
        waited += f" ({100 * waited_s / seconds:.1f}%)"
    tokens = " ".join(f"{s.name}={s.tokens:,}" for s in stats.sources)
    parts = [f"zephon: stage {stats.stage} ({stats.stage_name})", waited, f"tokens {tokens}"]
    if any(s.run_share is not None for s in stats.sources):
        parts.append("run share " + " ".join(f"{s.name}={s.run_share or 0.0:.3f}" for s in stats.sources))
    parts.append(f"padding {100 * stats.padding_fraction:.2f}%")
    return " | ".join(parts)
