"""Installing the adapter into a Megatron-LM process.

``install()`` does two things, both idempotent:

1. wraps Megatron's argument parsing so ``--dataloader-type zephon`` and the
   ``--zephon-*`` / ``--dataloader-save`` flags are accepted by every parse,
   including the ones ``pretrain()`` repeats internally (``args.py``);
2. wraps ``megatron.training.pretrain`` so that, when Zephon is selected, the
   dataset provider the training script passes (its own GPT datasets) is
   replaced by Zephon's, ``zephon`` is mapped to ``external`` and the start-up
   checks run on every rank before any model is built.

Call it before the training script imports ``pretrain`` by name (``from
megatron.training import pretrain``): ``python -m zephon_megatron.launch``
does this for you.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from zephon_megatron.args import install_arguments, is_requested, requested_in_argv

_PROVIDER_PARAM = "train_valid_test_dataset_provider"


def _global_args() -> Any:
    from megatron.training import global_vars

    return getattr(global_vars, "_GLOBAL_ARGS", None)


def zephon_selected() -> bool:
    """From the parsed arguments when there are some, else from the command line."""
    args = _global_args()
    if args is not None:
        return is_requested(args)
    return requested_in_argv()


def wrap_pretrain(original: Any) -> Any:
    """``pretrain`` with Zephon's provider substituted when Zephon is selected."""
    if getattr(original, "_zephon_wrapped", False):
        return original
    signature = inspect.signature(original)
    if _PROVIDER_PARAM not in signature.parameters:
        raise RuntimeError(f"zephon: this Megatron's pretrain() has no {_PROVIDER_PARAM!r} parameter; unsupported version")

    @functools.wraps(original)
    def pretrain(*args: Any, **kwargs: Any) -> Any:
        if not zephon_selected():
            return original(*args, **kwargs)
        from zephon_megatron.loader import prepare, train_valid_test_datasets_provider

        bound = signature.bind(*args, **kwargs)
        bound.arguments[_PROVIDER_PARAM] = train_valid_test_datasets_provider
        parsed = _global_args()
        if parsed is not None:  # megatron-core >= 0.18: the script parsed the arguments already
            prepare(parsed)
        return original(*bound.args, **bound.kwargs)

    pretrain._zephon_wrapped = True  # type: ignore[attr-defined]
    return pretrain


def install() -> None:
    """Make this process's Megatron accept and use ``--dataloader-type zephon``."""
    install_arguments()
    import megatron.training as mt
    import megatron.training.training as mtt

    wrapped = wrap_pretrain(mtt.pretrain)
    mtt.pretrain = wrapped
    mt.pretrain = wrapped
