"""The adapter's own settings, declared once for both TorchTitan generations.

``Settings`` is what a ``ZephonStream`` is built from. Each generation's config embeds it
by inheritance, so every field, its default and its description live here alone: TorchTitan
0.3's ``ZephonDataLoader.Config`` (a ``BaseDataLoader.Config``) and TorchTitan 0.2's
``[zephon]`` section (``tt02.ZephonSection``), each adding only the fields of its own. Both
generations parse with tyro, which finds an inherited field's description here, so the
``--dataloader.<field>`` and ``--zephon.<field>`` help reads the same.

Neither frozen nor slotted: the 0.3 trainer fills in its loader config after parsing, and a
slotted base would clash with the slots of ``BaseDataLoader.Config``.
"""

# No "from __future__ import annotations": TorchTitan 0.2 resolves the JobConfig field types
# itself, and the [zephon] section inherits these fields.

from dataclasses import dataclass, fields
from typing import Any

#: Bytes reserved for the state in the checkpoint: DCP loads tensors into
#: pre-sized buffers, so the slot has a fixed size that must not change between
#: a save and its load. 256 KiB holds thousands of lanes.
DEFAULT_STATE_CAPACITY = 1 << 18


@dataclass(kw_only=True)
class Settings:
    """The adapter's own settings, whatever config generation carried them."""

    recipe: str = ""
    """TOML data recipe: sources, weights, seed, packing, canonical_replicas, aggregation."""
    canonical_replicas: int = 0
    """Lanes; 0 takes the recipe's value (or the first dp degree)."""
    aggregate_dir: str = ""
    """Shared folder or object-store prefix where ranks merge checkpoints; "" takes the recipe's."""
    run_id: str = ""
    """Unique name of this training run in aggregate_dir; "" takes the recipe's."""
    aggregate_timeout_s: float = 0.0
    """Seconds rank 0 waits for the others at a checkpoint; 0 takes the recipe's (default 180)."""
    state_capacity_bytes: int = DEFAULT_STATE_CAPACITY
    """Fixed size of the checkpoint slot; keep it equal between a save and its resume."""


SETTING_NAMES = tuple(f.name for f in fields(Settings))


def settings_of(config: Any) -> Settings:
    """The ``Settings`` part of a config that embeds them (a 0.3 loader Config, a 0.2 ``[zephon]`` section)."""
    return Settings(**{name: getattr(config, name) for name in SETTING_NAMES})
