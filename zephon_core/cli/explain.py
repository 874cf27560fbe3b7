"""``zephon explain``: the plan of a recipe, without loading data (``--plot``: drawn)."""

from __future__ import annotations

import argparse
from typing import Any

from zephon_core.cli.options import add_shape_options, journal_option, load, pipeline
from zephon_core.errors import ConfigError
from zephon_core.integration.rules import Terms, Topology, next_multiple, topology_problems

#: The adapters' start-up rules, worded with this command's options.
TERMS = Terms(
    dp="data-parallel degree",
    dp_detail=" (--dp-degree)",
    canonical_replicas="canonical_replicas (--canonical-replicas or the recipe's)",
    aggregate_dir="--aggregate-dir",
    run_id="--run-id",
    step=lambda n: f"{n} batches (--batches-per-step)",
    step_fix=lambda C, n: f"pass --batches-per-step {next_multiple(n, C)}",
)


def refuse_topology(a: argparse.Namespace, recipe: Any) -> None:
    """Refuse a plan that both adapters would refuse at start-up, in their words (``integration.rules``)."""
    lanes = a.canonical_replicas or recipe.spec.canonical_replicas
    problems = topology_problems(Topology(a.dp_degree or 1, lanes, a.batches_per_step), TERMS)
    if problems:
        raise ConfigError(f"{a.recipe}: refused, as a training run would be: " + "; ".join(problems))


def run(a: argparse.Namespace) -> int:
    if a.plot:
        from zephon_core.report.load import require_matplotlib

        require_matplotlib()  # before the plan: a missing extra fails before any output
    recipe = load(a.recipe)
    refuse_topology(a, recipe)
    opts: dict[str, Any] = {"world_size": a.world_size, "global_rank": 0}
    if a.dp_degree is not None:
        opts["dp_degree"] = a.dp_degree
    if a.canonical_replicas is not None:
        opts["canonical_replicas"] = a.canonical_replicas
    if a.world_size > 1:
        opts.setdefault("aggregate_dir", recipe.spec.aggregate.dir or "<aggregate_dir>")
        opts.setdefault("run_id", recipe.spec.aggregate.run_id or "run")
    p = pipeline(recipe, a, **opts)
    print(p.explain(pipelines_per_node=a.per_node))
    if a.plot:
        from zephon_core.report.load import plan_png

        plan_png(p, a.plot, title=f"plan: {a.recipe}", global_batch_size=recipe.spec.global_batch_size,
                 batches_per_step=a.batches_per_step, plot_steps=a.plot_steps)
        print(f"wrote {a.plot}")
    return 0


def _plot_options(p: argparse.ArgumentParser) -> None:
    """``--plot`` and what it needs (``report.load.plan_png``)."""
    p.add_argument("--plot", metavar="PNG", help="draw the planned schedule: shares and epochs per source over "
                   "global steps (needs the plot extra: matplotlib)")
    p.add_argument("--plot-steps", type=int, metavar="N", help="draw the plan up to global step N (chunk N where "
                   "the plan has no steps); default: a quarter past the last stage's start")
    p.add_argument("--batches-per-step", type=int, help="for --plot without global_batch_size: batches per global step "
                   "(default: canonical_replicas)")


def register(sub: Any) -> None:
    p = sub.add_parser("explain", help="show the plan of a recipe without loading data")
    p.add_argument("recipe")
    p.add_argument("--dp-degree", type=int)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--per-node", type=int, help="pipelines per node (default LOCAL_WORLD_SIZE or 1)")
    p.add_argument("--canonical-replicas", type=int)
    _plot_options(p)
    journal_option(p)
    add_shape_options(p)
    p.set_defaults(fn=run)
