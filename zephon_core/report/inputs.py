"""What ``zephon report`` reads: checkpoints or batch audit logs, told apart by their content.

* a checkpoint: a JSON state, a TorchTitan DCP folder, a Megatron loader-state file
  (``integration.state_readers``, as ``zephon inspect`` reads them);
* several checkpoints: several paths, or a folder of ``step-N`` (TorchTitan's
  ``checkpoint/``, or its dump folder) or ``iter_NNNNNNN`` (Megatron's
  ``--dataloader-save``) checkpoints, read in step order;
* batch audit logs (``integration.batch_log``): one or more files, or a folder of ``*.log`` files.

A file that is neither is refused in one line naming it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_core.curriculum.definition import parse_definition
from zephon_core.errors import CliError, DataError
from zephon_core.integration.batch_log import LoggedBatch, parse_line
from zephon_core.integration.state_readers import StateReadError, load_checked_state
from zephon_core.verify.log_timelines import read_run_logs

# A checkpoint of a series: TorchTitan's step-N folders, Megatron's iter_NNNNNNN ones (or such JSON files).
STEP_NAME = re.compile(r"(?:step-|iter_)(\d+)(?:\.json)?")


@dataclass(frozen=True)
class Inputs:
    """The checkpoints (``(step from the name or None, path)``) or the audit logs named on the command line."""

    checkpoints: list[tuple[int | None, str]]
    logs: list[str]


def is_audit_log(path: str) -> bool:
    """Whether a file's first non-empty line is a batch audit line."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    parse_line(line)
                    return True
    except (OSError, UnicodeDecodeError, DataError):
        return False
    return False


def _series(folder: Path) -> list[tuple[int | None, str]]:
    """The step-N / iter_N checkpoints in ``folder`` or its ``checkpoint/``, by step (empty when there are none)."""
    for parent in (folder, folder / "checkpoint"):
        found = sorted(
            (int(m[1]), child)
            for child in (parent.iterdir() if parent.is_dir() else [])
            if (m := STEP_NAME.fullmatch(child.name))
        )
        if found:
            return [(step, _state_file(child)) for step, child in found]
    return []


def _state_file(path: Path) -> str:
    """What ``load_state`` reads for one checkpoint of a series: a DCP folder as it is, else the state file in it."""
    if path.is_file() or (path / ".metadata").exists():
        return str(path)
    # Megatron: iter_N/mp_rank_*/train_dataloader_dprank*.pt, every one holding the same merged state.
    for pattern in ("**/*.pt", "**/*.json"):
        files = sorted(path.glob(pattern))
        if files:
            return str(files[0])
    raise CliError(
        f"{path}: a checkpoint folder with neither a DCP .metadata nor a loader-state file (.pt, .json) in it"
    )


def classify(paths: Sequence[str]) -> Inputs:
    """Sort the command line's paths into checkpoints and audit logs; a mix of both is refused."""
    checkpoints: list[tuple[int | None, str]] = []
    logs: list[str] = []
    for path in paths:
        p = Path(path)
        if not p.exists():
            raise CliError(f"{path}: no such file or folder")
        if p.is_dir():
            found = sorted(str(f) for f in p.glob("*.log") if f.is_file() and is_audit_log(str(f)))
            series = [] if found else _series(p)
            logs += found
            checkpoints += series if series or found else [(None, path)]
        elif is_audit_log(path):
            logs.append(path)
        else:
            m = STEP_NAME.search(p.name)
            checkpoints.append((int(m[1]) if m else None, path))
    if logs and checkpoints:
        raise CliError(
            f"give either checkpoints or batch audit logs, not both "
            f"({checkpoints[0][1]} is a checkpoint, {logs[0]} a log)"
        )
    return Inputs(checkpoints, logs)


def read_state(path: str) -> dict[str, Any]:
    """A checkpoint's state, checked as a restore checks it (``load_checked_state``: a ``StateError`` naming the
    file); a file that holds none is refused naming it and what it is not."""
    try:
        return load_checked_state(path)
    except StateReadError as e:
        reason = str(e).removeprefix(f"{path}: ")
        raise CliError(f"{path}: neither a batch audit log nor a checkpoint state ({reason})") from None


def read_logs(paths: Sequence[str]) -> list[tuple[str, LoggedBatch]]:
    """Every batch of the audit logs, each with where it was read (``path line N``), as one timeline: a
    rolled-back launch's batches left out (``verify.log_timelines``); a torn, damaged or binary file, or one of two
    runs, is refused naming the file and line."""
    return read_run_logs(paths).logged


def row_shape(definition: Mapping[str, Any]) -> tuple[int, int] | None:
    """Rows per batch and tokens per row of a definition's ``batch`` and ``pack`` operators (None: no such ops)."""
    return parse_definition(definition).row_shape()
