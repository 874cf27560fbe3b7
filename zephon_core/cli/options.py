"""What several commands share: the run's shape (``--framework``, ``--tokenizer``, ``--seq-len``,
``--batch-size``) translated once into a ``Shape``, the progress options, loading a recipe and its pipeline."""

from __future__ import annotations

import argparse
from typing import Any

from zephon_core.integration.frameworks import framework_names
from zephon_core.verify.shape import Shape


def add_shape_options(p: argparse.ArgumentParser) -> None:
    """``--framework``, ``--tokenizer``, ``--seq-len`` and ``--batch-size`` for a command that builds a pipeline."""
    g = p.add_argument_group("the run's shape", "a [standalone] recipe has its own (these override it); "
                             "for a training recipe, give them as the run has them (docs/cli.md)")
    g.add_argument("--framework", choices=framework_names(),
                   help="tokenize and size as this framework's adapter does (its zephon.frameworks conventions)")
    g.add_argument("--tokenizer", metavar="PATH",
                   help="tokenizer.json or its folder (TorchTitan's hf_assets_path, Megatron's --tokenizer-model)")
    g.add_argument("--seq-len", type=int, help="tokens per row (training.seq_len, --seq-length)")
    g.add_argument("--batch-size", type=int, help="rows per batch (training.local_batch_size, --micro-batch-size)")


def shape_of(a: argparse.Namespace) -> Shape:
    """The run's shape as the command line gives it (None where not given)."""
    return Shape(a.tokenizer, a.seq_len, a.batch_size, a.framework)


def progress_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is not a terminal")
    p.add_argument("--no-progress", action="store_true")


def load(path: str) -> Any:
    """The recipe at ``path``."""
    from zephon_core.recipe import load_recipe

    return load_recipe(path)


def journal_option(p: argparse.ArgumentParser) -> None:
    """``--journal STATE``: a checkpoint's journals over the recipe: a steered run's mixing journal (docs/mixing.md)
    and its surgery journal (docs/when_a_run_goes_wrong.md), so the command sees the data the run trained on."""
    p.add_argument("--journal", metavar="STATE", help="a checkpoint of the run: the recipe with that state's journals "
                   "applied, the data the run trained on: a steered run's mixing journal (docs/mixing.md) and the "
                   "steps skipped and documents quarantined by surgery (docs/when_a_run_goes_wrong.md)")


def pipeline(recipe: Any, a: argparse.Namespace, **options: Any) -> Any:
    """The pipeline ``recipe`` defines, shaped as the command line says; ``options`` go to ``Pipeline.options``;
    with ``--journal``, as the run of that state had it (``with_history``: its mixing journal replayed, its
    surgery)."""
    from zephon_core.verify.shape import build

    p = build(recipe, shape_of(a), **options)
    if getattr(a, "journal", None):
        from zephon_core.integration.state_readers import load_checked_state
        from zephon_core.pipeline.mixing import with_history

        p = with_history(p, load_checked_state(a.journal), where=a.journal)
    return p


def is_recipe(path: str) -> bool:
    return path.endswith(".toml")
