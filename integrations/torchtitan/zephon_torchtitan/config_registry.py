"""TorchTitan 0.3 recipes with the Zephon loader: ``--module zephon_torchtitan --config NAME``.

Every ``ZephonDataLoader.Config`` field is then a ``--dataloader.<field>`` flag
(e.g. ``--dataloader.recipe``, ``--dataloader.canonical-replicas``), and the
job runs on ``ZephonTrainer``, which hands the loader the batch sizes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from torchtitan.models.llama3.config_registry import llama3_debugmodel
from torchtitan.trainer import Trainer

from zephon_torchtitan.tt03 import ZephonDataLoader, ZephonTrainer

_CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "data"


def on_zephon_trainer(cfg: Trainer.Config) -> ZephonTrainer.Config:
    """The same job on ``ZephonTrainer``: turn any TorchTitan recipe into one whose loader knows the batch sizes."""
    return ZephonTrainer.Config(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init})


def llama3_debugmodel_zephon() -> ZephonTrainer.Config:
    """llama3's debug model trained on the bundled corpus through Zephon."""
    cfg = on_zephon_trainer(llama3_debugmodel())
    cfg.dataloader = ZephonDataLoader.Config(recipe=str(_CONFIGS / "tt_train.toml"))
    cfg.validator = dataclasses.replace(
        cfg.validator, dataloader=ZephonDataLoader.Config(recipe=str(_CONFIGS / "tt_heldout.toml"), infinite=False)
    )
    return cfg
