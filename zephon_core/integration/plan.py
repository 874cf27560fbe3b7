"""One start-up plan: what a run will load, resolved once from its recipes and its framework's facts.

An adapter translates what its framework knows (``Facts``: data-parallel degree and rank, the
pipelines that checkpoint together, batches and rows per optimizer step, ...) and what its user
set (``Asked``: lanes, aggregation) and calls ``startup_plan`` once; the core decides. The plan
holds the training recipe, the lanes (``canonical_replicas``, resolved once), the coordination,
every held-out recipe (each loaded once) and the step rules; ``problems`` lists every rule the run
breaks, worded in the framework's ``Terms``, and ``rules.refuse`` raises them. Settings -> plan ->
refuse -> build: the adapters only translate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from zephon_core.errors import IntegrationError
from zephon_core.integration.coordination import (
    Coordination,
    coordination_of,
    load_training_recipe,
    pipeline_options,
    resolve_canonical_replicas,
)
from zephon_core.integration.rules import Terms, Topology, topology_problems
from zephon_core.recipe import Recipe


@dataclass(frozen=True)
class Facts:
    """What the framework knows of the run at start-up, in its own numbers."""

    dp_degree: int
    dp_rank: int = 0
    world_size: int = 1  # pipelines that checkpoint together (1: this one never merges with another)
    global_rank: int = 0
    batches_per_step: int | None = None  # batches one optimizer step takes over all data-parallel groups; None: unknown
    # (first, last, batches per step) of each run of equal optimizer steps when a schedule changes the step size
    # (empty: every step takes batches_per_step); the step-size rule holds at every one
    step_runs: tuple[tuple[int, int, int], ...] = ()
    rows_per_step: int | None = None  # rows one optimizer step takes (what start_step stages count); None: unknown
    step_varies: bool = False  # the global batch follows a schedule: a step is no fixed number of rows
    seq_len: int | None = None
    micro_batch_size: int | None = None
    tp: int = 1
    pp: int = 1
    cp: int = 1


@dataclass(frozen=True)
class Asked:
    """What the user set through the adapter (None: unset, the recipe's or the default applies)."""

    canonical_replicas: int | None = None
    aggregate_dir: str | None = None
    run_id: str | None = None
    aggregate_timeout_s: float | None = None
    run_id_suffix: str = ""  # appended to the resolved run_id (a torchft replica group checkpoints under its own)


@dataclass(frozen=True)
class HeldOut:
    """A held-out recipe, loaded once: its own lanes (its recipe's, else the data-parallel degree)."""

    path: str
    recipe: Recipe
    canonical_replicas: int

    @property
    def endless(self) -> bool:
        """It never ends (``exhausted`` other than ``"stop"``): no full validation reads it to its end."""
        return self.recipe.spec.exhausted != "stop"


@dataclass(frozen=True)
class StartupPlan:
    """A run's start-up, resolved: the recipe, lanes, coordination, held-out sets and step rules."""

    recipe: Recipe
    facts: Facts
    asked: Asked
    canonical_replicas: int | None  # None: the run resumes from a state not read yet, which holds them
    coordination: Coordination
    held_out: tuple[HeldOut, ...] = ()
    stepped_stages: tuple[int, ...] = field(default=())  # stages of the recipe that start at an optimizer step

    @property
    def stage_rows(self) -> int | None:
        """The rows per step ``start_step`` stages are placed by (None: nothing to place them by)."""
        return None if self.facts.step_varies else self.facts.rows_per_step

    def step_run(self) -> tuple[int, int, int] | None:
        """The run of a schedule's steps the step-size rule is checked at: the first that breaks it, else the
        first (None: no schedule, every step is ``batches_per_step``)."""
        runs, lanes = self.facts.step_runs, self.canonical_replicas
        return next((r for r in runs if lanes and r[2] % lanes), runs[0] if runs else None)

    def topology(self) -> Topology:
        f, c, run = self.facts, self.coordination, self.step_run()
        return Topology(f.dp_degree, self.canonical_replicas, run[2] if run else f.batches_per_step, f.world_size,
                        c.aggregate_dir, c.run_id)

    def problems(self, terms: Terms | None) -> list[str]:
        """Every rule the run breaks, one sentence each, the topology rules worded in ``terms`` (the schedule's
        steps concerned named through ``terms.at``); ``terms`` None: only the curriculum's."""
        run = self.step_run()
        if terms is not None and run is not None and terms.at is not None:
            terms = terms.at(run[0], run[1])
        out = topology_problems(self.topology(), terms) if terms is not None else []
        if self.stepped_stages and self.facts.step_varies:
            out.append(
                f"{self.recipe.path}: stages[{self.stepped_stages[0]}].start_step: this run's global batch size "
                "follows a schedule, so an optimizer step is no fixed number of tokens; "
                "start the stage with start_tokens"
            )
        return out

    def resumed(self, state: Mapping[str, Any] | None) -> StartupPlan:
        """The plan once a resumed state is read: lanes still unknown come from it (else the data-parallel degree)."""
        lanes = resolve_canonical_replicas(self.recipe, dp_degree=self.facts.dp_degree,
                                           setting=self.asked.canonical_replicas, resumed_state=state)
        lanes = int(lanes or self.facts.dp_degree)
        return replace(self, canonical_replicas=lanes, coordination=replace(self.coordination,
                                                                            canonical_replicas=lanes))

    def placed(self, **facts: Any) -> StartupPlan:
        """The plan for one rank: the facts known only once the framework placed it (its ranks, who checkpoints)."""
        return replace(self, facts=replace(self.facts, **facts))

    def options(self, *, world_size: int | None = None) -> dict[str, Any]:
        """``Pipeline.options`` of this rank's training pipeline (``world_size``: if not the facts')."""
        f = self.facts
        return pipeline_options(self.coordination, dp_degree=f.dp_degree, dp_group_id=f.dp_rank,
                                world_size=f.world_size if world_size is None else world_size,
                                global_rank=f.global_rank)


def startup_plan(recipe: str, facts: Facts, asked: Asked = Asked(), *, framework: str, role: str = "a training recipe",
                 held_out: tuple[str, ...] = (), held_out_role: str = "a held-out recipe", resuming: bool = False,
                 resumed_state: Mapping[str, Any] | None = None,
                 error: type[IntegrationError] = IntegrationError) -> StartupPlan:
    """The plan of a run: ``recipe`` and each ``held_out`` recipe loaded once, the lanes resolved once (``asked``,
    else the recipe's, else ``resumed_state``'s, else the data-parallel degree; None while ``resuming`` from a
    state not read yet)."""
    training = load_training_recipe(recipe, framework=framework, role=role, error=error)
    lanes = resolve_canonical_replicas(training, dp_degree=facts.dp_degree, setting=asked.canonical_replicas,
                                       resumed_state=resumed_state, resuming=resuming)
    coordination = coordination_of(training, lanes or facts.dp_degree, aggregate_dir=asked.aggregate_dir,
                                   run_id=asked.run_id, aggregate_timeout_s=asked.aggregate_timeout_s)
    run_id, suffix = coordination.run_id, asked.run_id_suffix
    if run_id and suffix and not run_id.endswith(suffix):
        coordination = replace(coordination, run_id=run_id + suffix)
    sets = []
    for path in held_out:
        r = load_training_recipe(path, framework=framework, role=held_out_role, error=error)
        sets.append(HeldOut(path, r, int(resolve_canonical_replicas(r, dp_degree=facts.dp_degree) or facts.dp_degree)))
    stepped = tuple(n for n, st in enumerate(training.spec.stages) if st.start_step is not None)
    return StartupPlan(training, facts, asked, lanes, coordination, tuple(sets), stepped)
