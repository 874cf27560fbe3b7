"""Reading a Zephon state out of whatever file holds it, for every command that reads one (``load_checked_state``).

A plain state is a JSON file. Framework checkpoints (a TorchTitan DCP folder, a
Megatron loader-state file) are read by readers their adapters register as
entry points of the group ``zephon.state_readers``, so the core never imports
an adapter::

    [project.entry-points."zephon.state_readers"]
    torchtitan = "zephon_torchtitan.readers:DCP"

An entry point names a ``StateReader``. Readers must never unpickle.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from zephon_core.checkpoint.state import parse_lanes, verify_checksum
from zephon_core.errors import ConfigError, StateError

GROUP = "zephon.state_readers"


class StateReadError(ConfigError):
    """A file that holds no readable Zephon state; the message names it and says what would read it."""


@dataclass(frozen=True)
class StateReader:
    """Reads the Zephon state out of one kind of framework checkpoint."""

    name: str
    holds: str  # what it reads, for messages: "a TorchTitan DCP checkpoint folder"
    claims: Callable[[str], bool]  # whether a path is of its kind (cheap: no import of the framework)
    read: Callable[[str], dict[str, Any]]


def registered() -> list[StateReader]:
    """Every reader the installed adapters register, by entry-point name."""
    readers = []
    for ep in sorted(metadata.entry_points(group=GROUP), key=lambda e: e.name):
        try:
            reader = ep.load()
        except ImportError:  # the adapter's framework is not installed: its checkpoints cannot be read here anyway
            continue
        if isinstance(reader, StateReader):
            readers.append(reader)
    return readers


def _install(adapter: str, missing: str | None) -> str:
    """How to get what a reader lacks: its adapter's extra, which brings its framework (a bare package name
    would leave out what the adapter needs with it)."""
    try:
        extras = metadata.metadata("zephon-suite").get_all("Provides-Extra") or []
    except metadata.PackageNotFoundError:  # a clone on the path, not installed
        extras = []
    return f"pip install 'zephon-suite[{adapter}]'" if adapter in extras else f"pip install {missing or adapter}"


def load_state(path: str, readers: list[StateReader] | None = None) -> dict[str, Any]:
    """The state in a JSON file, or in a framework checkpoint a registered reader claims."""
    if not path.endswith(".json"):
        for reader in registered() if readers is None else readers:
            if reader.claims(path):
                try:
                    return reader.read(path)
                except ImportError as e:
                    raise StateReadError(f"{path}: reading {reader.holds} needs {e.name or e} installed: "
                                         f"{_install(reader.name, e.name)}") from None
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except IsADirectoryError:
        raise StateReadError(f"{path}: a folder, and no installed adapter reads it as a checkpoint; "
                             "pass a state's .json file, or install the adapter that wrote it "
                             "(pip install 'zephon-suite[torchtitan]')") from None
    except OSError as e:
        raise StateReadError(f"{path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        hint = "" if path.endswith(".json") else "; no installed adapter claims it as a framework checkpoint either"
        raise StateReadError(f"{path}: not a JSON checkpoint state ({e}){hint}") from None
    if not isinstance(state, dict):
        raise StateReadError(f"{path}: not a JSON checkpoint state (a {type(state).__name__}, not an object)")
    return state


def load_checked_state(path: str, readers: list[StateReader] | None = None) -> dict[str, Any]:
    """``load_state``, then exactly the checks ``Pipeline.restore`` makes (``parse_lanes``, then ``verify_checksum``);
    a state that fails them is a ``StateError`` naming ``path`` (the checks themselves know the field, not the file).

    The one door for every command that reads a state: one that only shows a state (``zephon inspect``) checks it
    as strictly as a restore, so a hand-edited state is refused at once rather than by the next command that
    rewrites or replays it."""
    state = load_state(path, readers)
    try:
        parse_lanes(state)
        verify_checksum(state)
    except StateError as e:
        raise StateError(f"{path}: {e}; pass a state Zephon wrote, unchanged") from None
    return state
