"""Installing the adapter into a Megatron-LM process.

``install()`` does these things, all idempotent:

1. wraps Megatron's argument parsing so ``--dataloader-type zephon`` and the
   ``--zephon-*`` / ``--dataloader-save`` flags are accepted by every parse,
   including the ones ``pretrain()`` repeats internally (``args.py``);
2. wraps ``megatron.training.pretrain`` so that, when Zephon is selected, the
   dataset provider the training script passes (its own GPT datasets) is
   replaced by Zephon's, ``zephon`` is mapped to ``external`` and the start-up
   checks run on every rank before any model is built;
3. when Zephon is selected, two of Megatron's training-loop helpers behave
   as Zephon needs them to (both only change what megatron-core 0.19 gets
   wrong for an external loader):

   * ``checkpointing.maybe_save_dataloader_state`` is handed one model chunk's
     iterator instead of the list of them that virtual pipeline parallelism
     passes (the stock function reads ``.iterable`` of the list and fails); all
     chunks of a rank share one stream, so any chunk's state is the rank's;
   * ``training.dummy_train_step`` (``--iterations-to-skip``) reads nothing for a
     step the loader state's journal skips (the lanes leave its micro-batches out:
     ``zephon_megatron.surgery``); for any other skipped step (under a batch-size
     ramp) it reads the micro-batches on every chunk's iterator and drops them. The stock
     one also broadcasts them to tensor-parallel peers with fixed-shape receive
     buffers (which can wait forever for an attention mask Zephon does not
     send), calls ``next`` on a list of chunk iterators with virtual pipelines,
     and on None on middle pipeline stages; no rank needs a skipped step's data;

4. ``training.training_log`` is followed, with ``--zephon-log-metrics``, by Zephon's figures
   of the iteration in Megatron's TensorBoard / W&B writers and console
   (``zephon_megatron.metrics``); without it, by nothing;
5. in-process restart (``--inprocess-restart``, nvidia-resiliency-ext): Megatron's restart
   finalize (``inprocess_restart.destroy_state``) calls ``training.destroy_global_state``,
   which now first closes this rank's Zephon loader. It also clears Megatron's global
   arguments, which megatron-core 0.19's ``pretrain()`` does not parse again (the script
   parsed them before calling it), so the next attempt would stop at ``get_args()``: on a
   Zephon run with ``--inprocess-restart``, ``pretrain`` sets them again from a copy of the
   script's parsed arguments taken when the first attempt began, as a fresh parse of the
   same command line would.

6. a megatron-core installed from its wheel ships the dataset helpers prebuilt
   (``helpers_cpp``) but not the Makefile that ``pretrain()``'s rank 0 runs to build
   them (``compile_helpers``), so every launch from a pip install stops there with
   ``make: *** No targets specified``: when the prebuilt extension is there and the
   Makefile is not, ``compile_helpers`` uses the prebuilt one (on every device: the CPU
   shim did this alone before, so GPU launches failed).

Call it before the training script imports ``pretrain`` by name (``from
megatron.training import pretrain``): ``python -m zephon_megatron.launch``
does this for you.
"""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Any

from zephon_megatron.args import install_arguments, is_requested, requested_in_argv

_PROVIDER_PARAM = "train_valid_test_dataset_provider"

#: The arguments the training script parsed, copied when pretrain() began a Zephon run with
#: --inprocess-restart (before Megatron changes them): what the restart's next attempt starts from.
_SCRIPT_ARGS: dict[str, Any] = {"args": None}


def _global_args() -> Any:
    from megatron.training import global_vars

    return getattr(global_vars, "_GLOBAL_ARGS", None)


def zephon_selected() -> bool:
    """From the parsed arguments when there are some, else from the command line."""
    args = _global_args()
    if args is not None:
        return is_requested(args)
    return requested_in_argv()


def _restore_script_args() -> bool:
    """Set Megatron's global arguments again when a restart's finalize destroyed those of a Zephon run.

    ``set_global_variables`` on a copy is what the script's ``parse_and_validate_args``
    ended with (the tokenizer, the micro-batch calculator, timers and writers are made again).
    """
    kept = _SCRIPT_ARGS["args"]
    if kept is None or _global_args() is not None:
        return False
    from megatron.training.global_vars import set_global_variables

    set_global_variables(copy.deepcopy(kept))
    return True


def wrap_pretrain(original: Any) -> Any:
    """``pretrain`` with Zephon's provider substituted when Zephon is selected (the module's item 5: restarts)."""
    if getattr(original, "_zephon_wrapped", False):
        return original
    signature = inspect.signature(original)
    if _PROVIDER_PARAM not in signature.parameters:
        raise RuntimeError(f"zephon: this Megatron's pretrain() has no {_PROVIDER_PARAM!r} parameter; unsupported version")

    @functools.wraps(original)
    def pretrain(*args: Any, **kwargs: Any) -> Any:
        restarted = _restore_script_args()
        if not zephon_selected():
            return original(*args, **kwargs)
        from zephon_megatron.loader import prepare, train_valid_test_datasets_provider

        bound = signature.bind(*args, **kwargs)
        bound.arguments[_PROVIDER_PARAM] = train_valid_test_datasets_provider
        parsed = _global_args()
        if parsed is not None:  # megatron-core >= 0.18: the script parsed the arguments already
            if not restarted and getattr(parsed, "inprocess_restart", False):
                _SCRIPT_ARGS["args"] = copy.deepcopy(parsed)
            prepare(parsed)
        return original(*bound.args, **bound.kwargs)

    pretrain._zephon_wrapped = True  # type: ignore[attr-defined]
    return pretrain


def _wrap_once(make: Any) -> Any:
    """``make(original)`` builds the wrapper; wrapping a wrapper returns it unchanged."""

    @functools.wraps(make)
    def wrap(original: Any) -> Any:
        if getattr(original, "_zephon_wrapped", False):
            return original
        wrapper = functools.wraps(original)(make(original))
        wrapper._zephon_wrapped = True  # type: ignore[attr-defined]
        return wrapper

    return wrap


@_wrap_once
def wrap_save_dataloader_state(original: Any) -> Any:
    """``maybe_save_dataloader_state`` that accepts the list of per-chunk iterators of virtual pipelines."""

    def maybe_save_dataloader_state(train_iterator: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(train_iterator, list) and zephon_selected():
            train_iterator = next((it for it in train_iterator if it is not None), None)
        return original(train_iterator, *args, **kwargs)

    return maybe_save_dataloader_state


@_wrap_once
def wrap_dummy_train_step(original: Any) -> Any:
    """``dummy_train_step`` that consumes a skipped step's micro-batches on every chunk and sends nothing."""

    def dummy_train_step(data_iterator: Any) -> None:
        if not zephon_selected():
            return original(data_iterator)
        from megatron.core.num_microbatches_calculator import get_num_microbatches
        from megatron.core.rerun_state_machine import get_rerun_state_machine

        from zephon_megatron.iterators import skip_step

        rerun = get_rerun_state_machine()
        while rerun.should_run_forward_backward(data_iterator):
            skip_step(data_iterator, get_num_microbatches())
        return None

    return dummy_train_step


@_wrap_once
def wrap_training_log(original: Any) -> Any:
    """``training_log``, then Zephon's figures of the same iteration on the ranks that take or write them."""
    signature = inspect.signature(original)

    def training_log(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        from zephon_megatron.loader import current_metrics, current_source_loss, current_stream
        from zephon_megatron.steering import steer_current

        iteration = int(signature.bind(*args, **kwargs).arguments["iteration"])
        metrics = current_metrics()
        if metrics is not None:
            metrics.at_iteration(iteration)
        by_source = current_source_loss()
        if by_source is not None:
            figures = by_source.at_iteration(iteration)  # a collective: every rank calls training_log
            steer_current(figures, current_stream())  # --zephon-mixing: on the loading ranks
        return result

    return training_log


@_wrap_once
def wrap_destroy_global_state(original: Any) -> Any:
    """``destroy_global_state`` (an in-process restart's finalize) that first closes this rank's Zephon loader."""

    def destroy_global_state(*args: Any, **kwargs: Any) -> Any:
        from zephon_megatron.loader import close_current

        try:
            close_current()
        finally:
            result = original(*args, **kwargs)
        return result

    return destroy_global_state


def use_prebuilt_helpers() -> bool:
    """Make ``compile_helpers`` a no-op when megatron-core's wheel ships ``helpers_cpp`` prebuilt and no Makefile
    to build it (a source checkout, which has one, still compiles); whether it did."""
    import importlib.util
    from pathlib import Path

    import megatron.core.datasets.utils as ds_utils

    folder = Path(ds_utils.__file__).parent
    if (folder / "Makefile").exists() or importlib.util.find_spec("megatron.core.datasets.helpers_cpp") is None:
        return False
    ds_utils.compile_helpers = lambda: None
    return True


def install() -> None:
    """Make this process's Megatron accept and use ``--dataloader-type zephon``."""
    install_arguments()
    use_prebuilt_helpers()
    import megatron.training as mt
    import megatron.training.checkpointing as mck
    import megatron.training.training as mtt

    wrapped = wrap_pretrain(mtt.pretrain)
    mtt.pretrain = wrapped
    mt.pretrain = wrapped
    mck.maybe_save_dataloader_state = wrap_save_dataloader_state(mck.maybe_save_dataloader_state)
    mtt.dummy_train_step = wrap_dummy_train_step(mtt.dummy_train_step)
    mtt.training_log = wrap_training_log(mtt.training_log)
    mtt.destroy_global_state = wrap_destroy_global_state(mtt.destroy_global_state)
