"""Megatron-LM adapter for zephon_core: ``--dataloader-type zephon``.

Two entry points (see docs/megatron.md):

* a Megatron-LM checkout's own script, unchanged::

      torchrun ... -m zephon_megatron.launch pretrain_gpt.py --dataloader-type zephon \\
          --zephon-recipe configs/data/mg_train.toml --dataloader-save DIR ...

* megatron-core wheel only (this package's forward_step and get_batch)::

      torchrun ... -m zephon_megatron.pretrain_gpt --zephon-recipe ... --dataloader-save DIR ...

Or, in your own entry script, ``zephon_megatron.install()`` before importing
``megatron.training.pretrain``. Importing this package imports neither torch
nor Megatron.
"""

from __future__ import annotations

from typing import Any

__all__ = ["install", "read_loader_state"]


def install() -> None:
    """Make ``--dataloader-type zephon`` work in this process (see ``zephon_megatron.plugin``)."""
    from zephon_megatron.plugin import install as _install

    _install()


def read_loader_state(path: str) -> dict[str, Any]:
    """The Zephon state inside a Megatron ``train_dataloader_dprank*.pt`` file."""
    from zephon_megatron.state import read_loader_state as _read

    return _read(path)
