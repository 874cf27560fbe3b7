"""What an adapter resolves from a data recipe before it builds its pipelines.

* ``load_training_recipe``: a data recipe for a framework, which supplies the
  tokenizer, sequence length and batch size itself (so ``[standalone]`` is refused);
* ``resolve_coordination``: ``canonical_replicas``, the aggregation folder,
  ``run_id`` and timeout, from the adapter's options, the recipe, a resumed
  state and the data-parallel degree, in that order of precedence
  (``resolve_canonical_replicas``: the lanes alone, also before a resumed state is read);
* ``pipeline_options``: the ``Pipeline.options`` of one pipeline, from the resolved
  coordination and its data and coordination identity;
* ``bundled_configs``: the bundled ``configs/`` folder, from a clone or an installed wheel.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_core.errors import ConfigError, IntegrationError
from zephon_core.recipe import Recipe, load_recipe


def bundled_configs() -> Path:
    """The bundled ``configs/`` (recipes, demo corpus and tokenizer, job files): the clone's when this
    ``zephon_core`` runs from one, else the copy an installed wheel carries as the package ``zephon_configs``."""
    checkout = Path(__file__).resolve().parents[2] / "configs"
    if (checkout / "data" / "demo.toml").is_file():
        return checkout
    spec = importlib.util.find_spec("zephon_configs")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / "data" / "demo.toml").is_file():
            return Path(location)
    raise ConfigError("the bundled configs are missing from this installation of zephon-suite; reinstall it")


def load_training_recipe(path: str | os.PathLike[str], *, framework: str, role: str = "a training recipe",
                         error: type[IntegrationError] = IntegrationError) -> Recipe:
    """The recipe at ``path``, refused (as ``error``) if it has a ``[standalone]`` section: the framework
    supplies those values."""
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
    lanes = resolve_canonical_replicas(recipe, dp_degree=dp_degree, setting=canonical_replicas,
                                       resumed_state=resumed_state)
    return coordination_of(recipe, lanes or dp_degree, aggregate_dir=aggregate_dir, run_id=run_id,
                           aggregate_timeout_s=aggregate_timeout_s)


def coordination_of(recipe: Recipe, lanes: int, *, aggregate_dir: str | None = None, run_id: str | None = None,
                    aggregate_timeout_s: float | None = None) -> Coordination:
    """The coordination of resolved ``lanes``: the aggregation settings given (None or empty: unset), else the
    recipe's."""
    spec = recipe.spec
    folder = aggregate_dir or (recipe.resolve(spec.aggregate.dir) if spec.aggregate.dir else None)
    return Coordination(
        canonical_replicas=lanes,
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


