"""TorchTitan adapter for zephon_core: one package for both config generations.

TorchTitan 0.3.x (Python recipes, overrides), on any recipe::

    --override.imports 'zephon_torchtitan.zephon_loader={"recipe": "configs/data/tt_train.toml"}'

optionally with ``zephon_torchtitan.zephon_validation_loader={"recipe": ...}`` for
``validator.dataloader``; or a whole recipe whose loader fields are
``--dataloader.*`` flags::

    --module zephon_torchtitan --config llama3_debugmodel_zephon

TorchTitan 0.2.x (TOML job files): ``[job] custom_config_module`` and
``[experimental] custom_import`` both name ``zephon_torchtitan.tt02``, ``[model]
name = "llama3_zephon"``, and a ``[zephon]`` section; see docs/torchtitan.md.
"""

from __future__ import annotations

from typing import Any

try:
    from torchtitan.config.override import derive, override  # 0.3.x only
except ImportError:  # 0.2.x: use zephon_torchtitan.tt02
    pass
else:
    from torchtitan.components.dataloader import BaseDataLoader

    from zephon_torchtitan.tt03 import ZephonDataLoader, ZephonTrainer

    @override(target=BaseDataLoader.Config, fqns=["dataloader"], description="Zephon deterministic elastic loader")
    def zephon_loader(cfg: BaseDataLoader.Config, **kwargs: Any) -> ZephonDataLoader.Config:
        """Replace the training loader; kwargs are ``ZephonDataLoader.Config`` fields (``recipe`` required)."""
        return derive(cfg, ZephonDataLoader.Config, **kwargs)

    @override(target=BaseDataLoader.Config, fqns=["validator.dataloader"], description="Zephon held-out loader")
    def zephon_validation_loader(cfg: BaseDataLoader.Config, **kwargs: Any) -> ZephonDataLoader.Config:
        """Replace the validation loader with one pass over a held-out recipe."""
        kwargs.setdefault("infinite", False)
        return derive(cfg, ZephonDataLoader.Config, **kwargs)

    __all__ = ["ZephonDataLoader", "ZephonTrainer", "zephon_loader", "zephon_validation_loader"]
