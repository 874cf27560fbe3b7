"""``zephon inspect`` / ``zephon diff`` on TorchTitan checkpoints (the ``zephon.state_readers`` entry point)."""

from __future__ import annotations

import os
from typing import Any

from zephon_core.integration import StateReader


def _read(path: str) -> dict[str, Any]:
    from zephon_torchtitan.state import read_dcp_state

    return read_dcp_state(path)


DCP = StateReader(name="torchtitan", holds="a TorchTitan DCP checkpoint folder (torch)", claims=os.path.isdir, read=_read)
