"""The loader state in Megatron's per-iteration data-loader checkpoint files.

Megatron's ``maybe_save_dataloader_state`` asks the training iterator for
``save_state()`` on tensor-parallel rank 0 of the first pipeline stage (every
context-parallel rank of it; all but context-parallel rank 0 answer None, and
Megatron writes nothing for them), so once per data-parallel rank, and writes
``torch.save({"dataloader_state_dict": X})`` to::

    <--dataloader-save>/iter_<7 digits>/mp_rank_00[_000]/train_dataloader_dprank<3 digits>.pt

(``_000`` when pipeline parallelism is on). ``X`` is a small dict of plain
values with the Zephon state as JSON text, so the file loads with
``torch.load(weights_only=True)``: nothing is ever unpickled. Every data-parallel
rank's file holds the same merged state, so any of them restores the run on
any data-parallel size.

Megatron never reads these files back: the adapter's dataset provider does,
for exactly the iteration of the model checkpoint it resumed from.
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from zephon_core import StateError
from zephon_core.integration import parse_lanes, surgery_journal_of
from zephon_megatron.surgery import unpassed_batches
from zephon_megatron.validate import ZephonMegatronError

FORMAT = "zephon.megatron.loader_state"
VERSION = 1
#: The key Megatron's checkpoint hook stores the iterator's state under.
MEGATRON_KEY = "dataloader_state_dict"
FILE_PATTERN = "train_dataloader_dprank*.pt"
_ITER_DIR = re.compile(r"^iter_(\d{7})$")


@dataclass(frozen=True)
class LoaderState:
    """One loader-state file, parsed and checked."""

    path: str
    iteration: int  # optimizer steps completed when it was saved
    batches_per_step: int  # micro-batches (GBS / MBS) of the step after ``iteration`` in the run that saved it
    state: dict[str, Any]  # the merged Zephon state (JSON data)

    @property
    def delivered(self) -> int:
        """Micro-batches delivered over all lanes."""
        return sum(ls.delivered for ls in parse_lanes(self.state).values())


def state_file(dataloader_save: str, iteration: int, dp_rank: int, *, pipeline_parallel: bool) -> str:
    """Where Megatron (0.19) writes data-parallel rank ``dp_rank``'s file for ``iteration``."""
    sub = "mp_rank_00_000" if pipeline_parallel else "mp_rank_00"
    return os.path.join(dataloader_save, f"iter_{iteration:07d}", sub, f"train_dataloader_dprank{dp_rank:03d}.pt")


def encode(state: dict[str, Any], *, iteration: int, batches_per_step: int) -> dict[str, Any]:
    """What ``save_state()`` returns: plain values only, the state as JSON text."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "iteration": int(iteration),
        "batches_per_step": int(batches_per_step),
        "state_json": json.dumps(state, sort_keys=True, separators=(",", ":"), allow_nan=False),
    }


def decode(payload: Any, where: str) -> LoaderState:
    """Check a ``save_state()`` payload (as read back) and parse its state."""
    if not isinstance(payload, dict):
        raise ZephonMegatronError(f"{where}: the loader state is a {type(payload).__name__}, not a dict; it was not written by zephon_megatron")
    if payload.get("format") != FORMAT:
        raise ZephonMegatronError(f"{where}: not a Zephon loader state (format {payload.get('format')!r}, expected {FORMAT!r})")
    if payload.get("version") != VERSION:
        raise ZephonMegatronError(f"{where}: loader-state version {payload.get('version')!r} is not supported (this adapter reads {VERSION})")
    for key in ("iteration", "batches_per_step"):
        value = payload.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ZephonMegatronError(f"{where}: loader-state field {key} must be a non-negative integer, got {value!r}")
    text = payload.get("state_json")
    if not isinstance(text, str):
        raise ZephonMegatronError(f"{where}: loader-state field state_json must be JSON text, got {type(text).__name__}")
    try:
        state = json.loads(text)
        parse_lanes(state)
    except json.JSONDecodeError as e:
        raise ZephonMegatronError(f"{where}: loader-state field state_json is not valid JSON ({e})") from None
    except StateError as e:
        raise ZephonMegatronError(f"{where}: {e}") from None
    return LoaderState(where, payload["iteration"], payload["batches_per_step"], state)


def read_loader_file(path: str) -> LoaderState:
    """Load one ``train_dataloader_dprank*.pt`` safely (``weights_only=True``) and check it."""
    import pickle

    import torch

    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ZephonMegatronError(f"{path}: no such loader-state file") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, AttributeError, TypeError) as e:
        raise ZephonMegatronError(
            f"{path}: not a loader state this adapter can read safely: {_why_unreadable(e)}; "
            f"pass a {FILE_PATTERN} file that zephon_megatron wrote under --dataloader-save"
        ) from None
    if not isinstance(raw, dict) or MEGATRON_KEY not in raw:
        keys = sorted(map(str, raw)) if isinstance(raw, dict) else type(raw).__name__
        raise ZephonMegatronError(f"{path}: expected Megatron's {{{MEGATRON_KEY!r}: ...}} dict, found {keys}")
    return decode(raw[MEGATRON_KEY], path)


def _why_unreadable(e: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, in our words: torch's own advice (to load it
    with weights_only=False) would run whatever code the file holds, which a checkpoint reader never does."""
    found = re.search(r"GLOBAL ([\w.]+)", str(e))
    if found:
        return (f"it holds a pickled Python object ({found[1]}), and loading one could run code "
                "(weights_only=True refuses it)")
    return "not a file torch.save wrote, or a damaged one"


def read_loader_state(path: str) -> dict[str, Any]:
    """The Zephon state in a Megatron loader-state file (used by ``zephon inspect``)."""
    return read_loader_file(path).state


def saved_iterations(dataloader_save: str) -> list[int]:
    """Iterations with an ``iter_XXXXXXX`` folder under ``dataloader_save``."""
    try:
        names = os.listdir(dataloader_save)
    except OSError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := _ITER_DIR.match(n)))


def find_state_file(dataloader_save: str, iteration: int, dp_rank: int, *, pipeline_parallel: bool) -> str | None:
    """This rank's file for ``iteration``, else data-parallel rank 0's, else any file of that iteration.

    All of them hold the same merged state; the fallbacks cover a resume on more
    data-parallel ranks (there is no file for the new ranks) or with pipeline
    parallelism switched on or off (Megatron names the folder differently).
    """
    for pp in (pipeline_parallel, not pipeline_parallel):
        for rank in (dp_rank, 0):
            p = state_file(dataloader_save, iteration, rank, pipeline_parallel=pp)
            if os.path.isfile(p):
                return p
    found = sorted(glob.glob(os.path.join(glob.escape(dataloader_save), f"iter_{iteration:07d}", "mp_rank_*",
                                          FILE_PATTERN)))
    return found[0] if found else None


def load_for_iteration(dataloader_save: str | None, iteration: int, dp_rank: int, *, batches_per_step: int,
                       pipeline_parallel: bool, delivered: int | None = None,
                       consumed_samples: int | None = None) -> LoaderState:
    """The loader state saved at exactly ``iteration``, or a ``ZephonMegatronError`` saying why not.

    ``iteration`` is the model checkpoint's (``args.iteration``): states saved
    later (for instance by a save whose model checkpoint never completed) are
    ignored. ``batches_per_step`` is this run's number of micro-batches in the
    step after ``iteration``; ``delivered`` the micro-batches the model
    checkpoint has consumed (``consumed_train_samples / micro batch``; default
    ``iteration x batches_per_step``, a constant batch size).
    """
    if not dataloader_save:
        raise ZephonMegatronError(
            f"zephon: resuming at iteration {iteration} needs the loader state saved with it; pass --dataloader-save with "
            "the folder used when the checkpoint was written"
        )
    path = find_state_file(dataloader_save, iteration, dp_rank, pipeline_parallel=pipeline_parallel)
    if path is None:
        have = saved_iterations(dataloader_save)
        raise ZephonMegatronError(
            f"zephon: no loader state for iteration {iteration} under --dataloader-save {dataloader_save} "
            f"(expected {state_file(dataloader_save, iteration, dp_rank, pipeline_parallel=pipeline_parallel)}; "
            f"iterations with a loader state: {have or 'none'}); the model checkpoint and the loader state must come from "
            "the same save: point --dataloader-save at that run's folder, or --load at a checkpoint saved with a loader state"
        )
    st = read_loader_file(path)
    if st.iteration != iteration:
        raise ZephonMegatronError(
            f"zephon: {path} was saved at iteration {st.iteration}, but the model checkpoint is at iteration {iteration}; "
            "the loader state must come from the same save as the model checkpoint"
        )
    if st.batches_per_step != batches_per_step:
        raise ZephonMegatronError(
            f"zephon: {path} was saved by a run whose next step consumes {st.batches_per_step} micro-batches (global batch / "
            f"micro batch), this run's consumes {batches_per_step}; keep --global-batch-size (or the batch-size schedule) "
            "and --micro-batch-size as in the saved run"
        )
    want = iteration * batches_per_step if delivered is None else delivered
    # Saved right after skipped iterations, the lanes had not moved past those steps' batches yet.
    want -= unpassed_batches(surgery_journal_of(st.state), iteration, int(st.state["canonical_replicas"]))
    if st.delivered != want:
        how = (f"iteration {iteration} x {batches_per_step} micro-batches per step" if consumed_samples is None else
               f"the model checkpoint's {consumed_samples} consumed samples / micro batch")
        raise ZephonMegatronError(
            f"zephon: {path} holds {st.delivered} delivered micro-batches, but {how} = {want}; the file does not belong to "
            "this checkpoint (saved at another iteration, or altered)"
        )
    return st
