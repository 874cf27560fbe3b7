"""Read Zephon's state out of a TorchTitan DCP checkpoint folder (for ``zephon inspect``).

Only the ``dataloader.zephon_state`` tensor is read; no process group is
needed and nothing is unpickled.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

from zephon_core.integration import IntegrationError
from zephon_torchtitan.core import STATE_KEY, decode_state

DCP_KEY = f"dataloader.{STATE_KEY}"


def read_dcp_state(folder: str) -> dict[str, Any]:
    """The Zephon state stored in a TorchTitan checkpoint (``.../checkpoint/step-N``)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not os.path.exists(os.path.join(folder, ".metadata")):
        raise IntegrationError(f"{folder}: not a DCP checkpoint folder (no .metadata); {_which_folder(folder)}")
    reader = dcp.FileSystemReader(folder)
    meta = reader.read_metadata().state_dict_metadata.get(DCP_KEY)
    if meta is None:
        raise IntegrationError(f"{folder}: this checkpoint has no Zephon loader state ({DCP_KEY}); it was not written with the Zephon loader")
    if not isinstance(meta, TensorStorageMetadata):
        raise IntegrationError(f"{folder}: {DCP_KEY} is not a tensor; refusing to unpickle it")
    slot = {DCP_KEY: torch.zeros(meta.size, dtype=meta.properties.dtype)}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(slot, storage_reader=reader, no_dist=True)
    return decode_state(slot[DCP_KEY])


def _which_folder(folder: str) -> str:
    """What to pass instead: the step-N checkpoints under ``folder`` (TorchTitan's dump folder or its checkpoint/), if any."""
    for parent in (folder, os.path.join(folder, "checkpoint")):
        steps = sorted((int(m[1]), name) for name in (os.listdir(parent) if os.path.isdir(parent) else [])
                       if (m := re.fullmatch(r"step-(\d+)", name)) and os.path.exists(os.path.join(parent, name, ".metadata")))
        if steps:
            names = ", ".join(name for _, name in steps)
            return f"it holds the checkpoints {names}: pass one of them, e.g. {os.path.join(parent, steps[-1][1])}"
    return "pass a checkpoint folder, .../checkpoint/step-N"
