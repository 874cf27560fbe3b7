"""TorchTitan adapter for zephon_core: one package for both config generations.

TorchTitan 0.3.x (Python recipes, overrides), on any recipe::

    --override.imports 'zephon_torchtitan.zephon_loader={"recipe": "configs/data/tt_train.toml"}'

optionally with ``zephon_torchtitan.zephon_validation_loader={"recipe": ...}`` for
``validator.dataloader`` and ``zephon_torchtitan.zephon_metrics`` for Zephon's figures in
TorchTitan's metrics (TensorBoard, W&B, the console), with ``zephon_torchtitan.zephon_source_loss``
and ``"source_loss": true`` for the training loss per source (``"mixing": true`` too: the recipe's
``[mixing]`` steers the mixture by it, ``zephon_torchtitan.steering``); or a whole recipe whose loader
fields are ``--dataloader.*`` flags::

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
    from torchtitan.components.loss import BaseLoss
    from torchtitan.components.metrics import MetricsProcessor

    from zephon_core.integration import IntegrationError
    from zephon_torchtitan.tt03 import (
        ZephonChunkedLossWrapper,
        ZephonCrossEntropyLoss,
        ZephonDataLoader,
        ZephonMetricsProcessor,
        ZephonTrainer,
        with_source_loss,
    )

    @override(target=BaseDataLoader.Config, fqns=["dataloader"], description="Zephon deterministic elastic loader")
    def zephon_loader(cfg: BaseDataLoader.Config, **kwargs: Any) -> ZephonDataLoader.Config:
        """Replace the training loader; kwargs are ``ZephonDataLoader.Config`` fields (``recipe`` required)."""
        return derive(cfg, ZephonDataLoader.Config, **kwargs)

    @override(target=BaseDataLoader.Config, fqns=["validator.dataloader"], description="Zephon held-out loader")
    def zephon_validation_loader(cfg: BaseDataLoader.Config, **kwargs: Any) -> ZephonDataLoader.Config:
        """Replace the validation loader with one pass over a held-out recipe."""
        kwargs.setdefault("infinite", False)
        return derive(cfg, ZephonDataLoader.Config, **kwargs)

    @override(target=MetricsProcessor.Config, fqns=["metrics"], description="Zephon's figures in TorchTitan's metrics")
    def zephon_metrics(cfg: MetricsProcessor.Config) -> ZephonMetricsProcessor.Config:
        """Log Zephon's figures (``zephon/...``) with TorchTitan's own, every ``metrics.log_freq`` steps."""
        if isinstance(cfg, ZephonMetricsProcessor.Config):
            return cfg
        if type(cfg) is not MetricsProcessor.Config:  # replacing the job's own processor would drop what it logs
            raise IntegrationError(
                "zephon: zephon_torchtitan.zephon_metrics replaces TorchTitan's MetricsProcessor, but this job's "
                f"metrics processor is {type(cfg).__qualname__}; mix zephon_torchtitan.metrics.MetricsLogging into "
                "that processor instead (before its base class) and set its zephon = "
                "zephon_torchtitan.metrics.TrainingMetrics()"
            )
        return derive(cfg, ZephonMetricsProcessor.Config)

    @override(target=BaseLoss.Config, fqns=["loss"], description="Zephon's per-source training loss")
    def zephon_source_loss(cfg: BaseLoss.Config) -> BaseLoss.Config:
        """The job's cross entropy, also adding each token's loss to its source (the loader's ``source_loss``)."""
        return with_source_loss(cfg)

    __all__ = ["ZephonChunkedLossWrapper", "ZephonCrossEntropyLoss", "ZephonDataLoader", "ZephonMetricsProcessor",
               "ZephonTrainer", "zephon_loader", "zephon_metrics", "zephon_source_loss", "zephon_validation_loader"]
