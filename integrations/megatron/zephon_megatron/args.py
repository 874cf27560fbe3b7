"""The ``--dataloader-type zephon`` choice and the adapter's flags.

``--dataloader-type`` is a plain argparse choice in Megatron. Megatron parses
``sys.argv`` more than once: the training script's own parse, then again
inside ``pretrain()`` (fault-tolerance setup) and in the in-process-restart
wrapper, each time through ``megatron.training.arguments.parse_args`` and
without the script's extra-arguments provider. So the adapter wraps two
module attributes, which every one of those parses looks up at call time:

* ``add_megatron_arguments``: every Megatron parser accepts ``zephon``;
* ``parse_args``: the adapter's flags are added after the caller's own
  provider (skipping any flag the caller already defines, e.g.
  ``--dataloader-save``).

Megatron itself only knows ``single | cyclic | external``: ``to_external``
maps ``zephon`` to ``external`` (the seam for loaders that are their own
iterators) and sets ``args.zephon = True``; checkpoints therefore record
``external``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CHOICE = "zephon"

_FLAGS: list[tuple[str, dict[str, Any]]] = [
    ("--zephon-recipe", dict(type=str, default=None, metavar="TOML",
                             help="Zephon data recipe for training (needs --dataloader-type zephon).")),
    ("--zephon-valid-recipe", dict(type=str, nargs="+", default=None, metavar="TOML",
                                   help="Held-out recipe(s) for Megatron's evaluations; every evaluation reads the same "
                                        "batches. Several: one loss per recipe (--multiple-validation-sets "
                                        "--full-validation).")),
    ("--zephon-canonical-replicas", dict(type=int, default=None, metavar="C",
                                         help="Number of lanes (fixed for the life of a run; default: the recipe's, else the "
                                              "first run's data-parallel size).")),
    ("--zephon-aggregate-dir", dict(type=str, default=None, metavar="DIR",
                                    help="Shared folder (or fsspec URL) where data-parallel ranks merge the loader state "
                                         "(needed when DP > 1; default: the recipe's [aggregate] dir).")),
    ("--zephon-run-id", dict(type=str, default=None, metavar="ID",
                             help="Run name inside the aggregate folder, unique per training run (default: the recipe's).")),
    ("--zephon-log-metrics", dict(action="store_true", default=False,
                                  help="Every --log-interval, write Zephon's figures (zephon/...) to Megatron's "
                                       "TensorBoard and W&B writers and its console (on the last rank, as Megatron's "
                                       "own).")),
    ("--zephon-source-loss", dict(action="store_true", default=False,
                                  help="Every --log-interval, the training loss per source (zephon/loss/<source>) in "
                                       "Megatron's TensorBoard and W&B writers and its console, on the last rank "
                                       "(the wheel entry zephon_megatron.pretrain_gpt only).")),
    ("--zephon-mixing", dict(action="store_true", default=False,
                             help="Steer the mixture by the recipe's [mixing] table with the per-source loss at every "
                                  "--log-interval (docs/mixing.md); needs --zephon-source-loss.")),
    ("--dataloader-save", dict(type=str, default=None, metavar="DIR",
                               help="Folder for the per-iteration loader state (Megatron's maybe_save_dataloader_state); "
                                    "the state of the resumed iteration is read back from it.")),
]

FLAG_NAMES = tuple(name for name, _ in _FLAGS)


def allow_zephon_choice(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``zephon`` to the choices of ``--dataloader-type`` (if the parser has it)."""
    action = parser._option_string_actions.get("--dataloader-type")
    if action is not None and action.choices is not None and CHOICE not in action.choices:
        action.choices = [*action.choices, CHOICE]
    return parser


def add_zephon_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the adapter's flags that ``parser`` does not define yet."""
    missing = [(n, kw) for n, kw in _FLAGS if n not in parser._option_string_actions]
    if missing:
        group = parser.add_argument_group(title="zephon", description="Zephon data loader (zephon_megatron)")
        for name, kwargs in missing:
            group.add_argument(name, **kwargs)
    return allow_zephon_choice(parser)


def install_arguments() -> None:
    """Wrap ``add_megatron_arguments`` and ``parse_args`` in ``megatron.training.arguments`` (idempotent)."""
    import megatron.training.arguments as margs

    if not getattr(margs.add_megatron_arguments, "_zephon_wrapped", False):
        original_add = margs.add_megatron_arguments

        def add_megatron_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
            return allow_zephon_choice(original_add(parser))

        add_megatron_arguments._zephon_wrapped = True  # type: ignore[attr-defined]
        add_megatron_arguments.__wrapped__ = original_add  # type: ignore[attr-defined]
        margs.add_megatron_arguments = add_megatron_arguments

    if not getattr(margs.parse_args, "_zephon_wrapped", False):
        original_parse = margs.parse_args

        def parse_args(extra_args_provider: Any = None, ignore_unknown_args: bool = False) -> argparse.Namespace:
            def provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
                if extra_args_provider is not None:
                    parser = extra_args_provider(parser)
                return add_zephon_arguments(parser)

            return original_parse(provider, ignore_unknown_args)

        parse_args._zephon_wrapped = True  # type: ignore[attr-defined]
        parse_args.__wrapped__ = original_parse  # type: ignore[attr-defined]
        margs.parse_args = parse_args


def requested_in_argv(argv: Sequence[str] | None = None) -> bool:
    """Whether the command line asks for ``--dataloader-type zephon`` (its last occurrence wins)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    value = None
    for i, a in enumerate(argv):
        if a == "--dataloader-type" and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith("--dataloader-type="):
            value = a.split("=", 1)[1]
    return value == CHOICE


def is_requested(args: Any) -> bool:
    """Whether ``args`` (Megatron's namespace) selects Zephon, before or after ``to_external``."""
    return getattr(args, "dataloader_type", None) == CHOICE or bool(getattr(args, "zephon", False))


def to_external(args: Any) -> bool:
    """Map ``zephon`` to Megatron's ``external`` in place; True when Zephon is selected."""
    if getattr(args, "dataloader_type", None) == CHOICE:
        args.dataloader_type = "external"
        args.zephon = True
    return bool(getattr(args, "zephon", False))


def fill_eval_interval(args: Any) -> None:
    """Give ``--eval-interval`` a value when ``--eval-iters 0`` leaves it unused.

    megatron-core 0.19 has no default for it and divides by it while sizing the
    datasets, even when nothing is evaluated; with evaluations, the user must say
    how often (the validators refuse otherwise).
    """
    if getattr(args, "eval_interval", 0) is None and not getattr(args, "eval_iters", 0):
        args.eval_interval = max(1, int(getattr(args, "train_iters", None) or 1))


@dataclass(frozen=True)
class Settings:
    """The adapter's flags, read from Megatron's namespace."""

    recipe: str
    valid_recipes: tuple[str, ...] = ()
    canonical_replicas: int | None = None
    aggregate_dir: str | None = None
    run_id: str | None = None
    dataloader_save: str | None = None
    log_metrics: bool = False
    source_loss: bool = False
    mixing: bool = False

    @classmethod
    def selected(cls, args: Any) -> Settings | None:
        """The settings of a run that selects Zephon, with ``args`` made ready for Megatron (``zephon`` mapped to
        ``external``, ``--eval-interval`` filled); None, and ``args`` untouched, when it does not select it."""
        if not is_requested(args):
            return None
        to_external(args)
        fill_eval_interval(args)
        return cls.from_args(args)

    @classmethod
    def from_args(cls, args: Any) -> Settings:
        from zephon_megatron.validate import ZephonMegatronError

        recipe = getattr(args, "zephon_recipe", None)
        if not recipe:
            raise ZephonMegatronError("zephon: --dataloader-type zephon needs --zephon-recipe <data recipe .toml>")
        return cls(
            recipe=recipe,
            valid_recipes=_as_tuple(getattr(args, "zephon_valid_recipe", None)),
            canonical_replicas=getattr(args, "zephon_canonical_replicas", None),
            aggregate_dir=getattr(args, "zephon_aggregate_dir", None) or None,
            run_id=getattr(args, "zephon_run_id", None) or None,
            dataloader_save=getattr(args, "dataloader_save", None) or None,
            log_metrics=bool(getattr(args, "zephon_log_metrics", False)),
            source_loss=bool(getattr(args, "zephon_source_loss", False)),
            mixing=bool(getattr(args, "zephon_mixing", False)),
        )


def _as_tuple(value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)
