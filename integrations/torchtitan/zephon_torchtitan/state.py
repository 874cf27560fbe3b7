"""Read Zephon's state out of a TorchTitan DCP checkpoint folder (for ``zephon inspect``).

Only the ``dataloader.zephon_state`` tensor is read; no process group is
needed. The folder's ``.metadata`` is a pickle (torch writes it so): it is read
by an unpickler that builds only the classes DCP metadata is made of, so a
crafted file is refused rather than run.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
from typing import Any

from zephon_core.integration import IntegrationError
from zephon_torchtitan.core import STATE_KEY, decode_state

DCP_KEY = f"dataloader.{STATE_KEY}"
_PASS_STEP = "pass a checkpoint folder TorchTitan wrote, .../checkpoint/step-N"


def read_dcp_state(folder: str) -> dict[str, Any]:
    """The Zephon state stored in a TorchTitan checkpoint (``.../checkpoint/step-N``)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not os.path.exists(os.path.join(folder, ".metadata")):
        raise IntegrationError(f"{folder}: not a DCP checkpoint folder (no .metadata); {_which_folder(folder)}")
    metadata = _read_metadata(os.path.join(folder, ".metadata"))

    class Reader(dcp.FileSystemReader):  # DCP's own read_metadata would unpickle anything
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            return metadata

    reader = Reader(folder)
    meta = metadata.state_dict_metadata.get(DCP_KEY)
    if meta is None:
        raise IntegrationError(f"{folder}: this checkpoint has no Zephon loader state ({DCP_KEY}); it was not written with the Zephon loader")
    if not isinstance(meta, TensorStorageMetadata):
        raise IntegrationError(f"{folder}: {DCP_KEY} is not a tensor; refusing to unpickle it")
    slot = {DCP_KEY: torch.zeros(meta.size, dtype=meta.properties.dtype)}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(slot, storage_reader=reader, no_dist=True)
    try:
        return decode_state(slot[DCP_KEY])
    except IntegrationError as e:
        raise IntegrationError(f"{folder}: {str(e).removeprefix('zephon: ')}") from None


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only what DCP's ``Metadata`` holds: its own dataclasses, torch sizes, dtypes and layouts, paths."""

    PLAIN = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
             ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("pathlib", "PosixPath"),
             ("pathlib", "PurePosixPath"), ("builtins", "set"), ("builtins", "frozenset")}

    def find_class(self, module: str, name: str) -> Any:
        import torch

        known = module in ("torch", "pathlib", "collections", "builtins") or module.startswith("torch.")
        found = super().find_class(module, name) if known else None  # nothing else is even imported
        allowed = ((module, name) in self.PLAIN or isinstance(found, torch.dtype)
                   or (module == "torch.distributed.checkpoint.metadata" and isinstance(found, type)))
        if not allowed:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which DCP metadata never holds; "
                                         "refusing to unpickle it")
        return found


def _read_metadata(path: str) -> Any:
    """The checkpoint's DCP ``Metadata``, or an ``IntegrationError`` naming the file (never a pickle's own error)."""
    from torch.distributed.checkpoint.metadata import Metadata

    damaged = "not a DCP metadata file torch wrote, or a damaged one"
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except OSError as e:
        raise IntegrationError(f"{path}: {e.strerror}; {_PASS_STEP}") from None
    except pickle.UnpicklingError as e:
        raise IntegrationError(f"{path}: {e if str(e).startswith('it names') else damaged}; {_PASS_STEP}") from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, ImportError):
        raise IntegrationError(f"{path}: {damaged}; {_PASS_STEP}") from None
    if not isinstance(metadata, Metadata):
        raise IntegrationError(f"{path}: holds a {type(metadata).__name__}, not DCP metadata; {_PASS_STEP}")
    return metadata


def _which_folder(folder: str) -> str:
    """What to pass instead: the step-N checkpoints under ``folder`` (TorchTitan's dump folder or its checkpoint/), if any."""
    for parent in (folder, os.path.join(folder, "checkpoint")):
        steps = sorted((int(m[1]), name) for name in (os.listdir(parent) if os.path.isdir(parent) else [])
                       if (m := re.fullmatch(r"step-(\d+)", name)) and os.path.exists(os.path.join(parent, name, ".metadata")))
        if steps:
            names = ", ".join(name for _, name in steps)
            return f"it holds the checkpoints {names}: pass one of them, e.g. {os.path.join(parent, steps[-1][1])}"
    return "pass a checkpoint folder, .../checkpoint/step-N"
