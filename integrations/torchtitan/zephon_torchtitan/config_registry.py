"""TorchTitan 0.3 recipes with the Zephon loader: ``--module zephon_torchtitan --config NAME``.

Every ``ZephonDataLoader.Config`` field is then a ``--dataloader.<field>`` flag
(e.g. ``--dataloader.recipe``, ``--dataloader.canonical-replicas``), and the
job runs on ``ZephonTrainer``, which hands the loader the batch sizes
(``llama3_debugmodel_zephon_ft``: on ``ZephonFTTrainer``, under torchft in live mode).
"""

from __future__ import annotations

import dataclasses

from torchtitan.models.llama3.config_registry import llama3_debugmodel
from torchtitan.trainer import Trainer

from zephon_core.integration import bundled_configs
from zephon_torchtitan.tt03 import ZephonDataLoader, ZephonTrainer


def on_zephon_trainer(cfg: Trainer.Config) -> ZephonTrainer.Config:
    """The same job on ``ZephonTrainer``: turn any TorchTitan recipe into one whose loader knows the batch sizes."""
    return ZephonTrainer.Config(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init})


def llama3_debugmodel_zephon() -> ZephonTrainer.Config:
    """llama3's debug model trained on the bundled corpus and tokenizer through Zephon.

    Sized for the bundled recipe (``configs/data/tt_train.toml``, 4 lanes): rows of
    128 tokens, 2 per batch, 8 per optimizer step, so every step consumes 4
    batches on any data-parallel degree dividing 4 (1, 2 or 4 ranks).
    """
    configs = bundled_configs()
    cfg = on_zephon_trainer(llama3_debugmodel())
    cfg.hf_assets_path = str(configs / "corpus")
    cfg.training = dataclasses.replace(cfg.training, local_batch_size=2, global_batch_size=8, seq_len=128)
    cfg.dataloader = ZephonDataLoader.Config(recipe=str(configs / "data" / "tt_train.toml"))
    cfg.validator = dataclasses.replace(
        cfg.validator, dataloader=ZephonDataLoader.Config(recipe=str(configs / "data" / "tt_heldout.toml"), infinite=False)
    )
    return cfg


def llama3_debugmodel_zephon_ft() -> Trainer.Config:
    """``llama3_debugmodel_zephon`` under torchft in live mode (``zephon_torchtitan.ft``): start one launch per
    replica group with ``--fault_tolerance.replica_id N`` and ``TORCHFT_LIGHTHOUSE`` set; checkpoints every 10
    steps (torchft heals a joining group from the checkpoint manager's state), seed 0 (every group starts alike)."""
    from zephon_torchtitan.ft import on_zephon_ft_trainer

    cfg = on_zephon_ft_trainer(llama3_debugmodel_zephon())
    cfg.checkpoint = dataclasses.replace(cfg.checkpoint, enable=True, interval=10)
    cfg.debug = dataclasses.replace(cfg.debug, seed=0)
    return cfg
