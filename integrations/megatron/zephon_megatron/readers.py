"""``zephon inspect`` / ``zephon diff`` on Megatron loader-state files (the ``zephon.state_readers`` entry point)."""

from __future__ import annotations

from typing import Any

from zephon_core.integration import StateReader


def _read(path: str) -> dict[str, Any]:
    from zephon_megatron.state import read_loader_state

    return read_loader_state(path)


LOADER_STATE = StateReader(name="megatron", holds="a Megatron loader-state file (torch)", claims=lambda p: p.endswith(".pt"), read=_read)
