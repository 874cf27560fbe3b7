"""TorchTitan 0.2.x (TOML job files): enable Zephon from the job file alone.

    [job]
    custom_config_module = "zephon_torchtitan.tt02"   # adds the [zephon] section
    [experimental]
    custom_import = "zephon_torchtitan.tt02"          # registers "<model>_zephon" train specs
    [model]
    name = "llama3_zephon"
    [zephon]
    recipe = "configs/data/tt_train.toml"

Every ``[zephon]`` field is also a ``--zephon.<field>`` flag. ``log_metrics = true`` adds
Zephon's figures to TorchTitan's metrics (the ``<model>_zephon`` train specs build
``ZephonMetricsProcessor022``).
"""

# No "from __future__ import annotations": TorchTitan 0.2 resolves the JobConfig field types itself.

from dataclasses import dataclass, field, fields, replace
from typing import Any, cast

from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.validate import Validator
from torchtitan.protocols.train_spec import get_train_spec, register_train_spec

from zephon_core.integration import IntegrationError
from zephon_torchtitan.core import StreamLoader, ZephonStream
from zephon_torchtitan.metrics import MetricsLogging, TrainingMetrics
from zephon_torchtitan.settings import Settings, settings_of

BASE_MODELS = ("llama3", "llama4", "qwen3", "deepseek_v3")
#: TorchTitan 0.2's Trainer trains every step it counts: a skip would shift its step numbers, so it is refused.
SKIPS_022 = ("TorchTitan 0.2's trainer cannot leave a step untrained (its step numbers would shift); resume that "
             "checkpoint under TorchTitan 0.3 with --module zephon_torchtitan (ZephonTrainer), or take the skip out "
             "of the recipe's [surgery] table")


@dataclass(kw_only=True)
class ZephonSection(Settings):
    # The adapter's Settings (zephon_torchtitan.settings, described there), and what only TorchTitan 0.2 needs.
    validation_recipe: str = ""
    """Held-out TOML data recipe for [validation]; required when validation is enabled."""
    log_metrics: bool = False
    """Log Zephon's figures (zephon/...) with TorchTitan's metrics every [metrics] log_freq steps."""


@dataclass
class JobConfig:
    """Merged into TorchTitan's JobConfig by ``[job] custom_config_module``."""

    zephon: ZephonSection = field(default_factory=ZephonSection)


#: What each [zephon] field must hold; a float field also takes an integer (TOML's 30 for 30.0).
_TYPES: dict[str, type | tuple[type, ...]] = {f.name: (int, float) if f.type is float else cast(type, f.type)
                                              for f in fields(ZephonSection)}


def settings_from(job_config: Any) -> Settings:
    """Our section, type-checked: TorchTitan 0.2 only warns about wrong types in custom sections."""
    section = getattr(job_config, "zephon", None)
    if section is None:
        raise IntegrationError("zephon: the job has no [zephon] section; set [job] custom_config_module = \"zephon_torchtitan.tt02\"")
    for name, kind in _TYPES.items():
        value = getattr(section, name)
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            raise IntegrationError(f"zephon: [zephon] {name} must be {getattr(kind, '__name__', 'a number')}, got {value!r}")
    return replace(settings_of(section), aggregate_timeout_s=float(section.aggregate_timeout_s))


class ZephonDataLoader022(StreamLoader, BaseDataLoader):
    """The Zephon loader in TorchTitan 0.2's loader slot."""

    def __init__(self, stream: ZephonStream) -> None:
        self._stream = stream


def build_zephon_dataloader(dp_world_size: int, dp_rank: int, tokenizer: Any, job_config: Any, **kwargs: Any) -> ZephonDataLoader022:
    training = job_config.training
    local = training.local_batch_size
    global_batch = training.global_batch_size if training.global_batch_size > 0 else local * dp_world_size
    stream = ZephonStream(
        settings_from(job_config),
        dp_world_size=dp_world_size,
        dp_rank=dp_rank,
        tokenizer=tokenizer,
        seq_len=training.seq_len,
        local_batch_size=local,
        batches_per_step=global_batch // local,
    )
    stream.skips_refused = SKIPS_022
    return ZephonDataLoader022(stream)


class ZephonValidator(Validator):
    """TorchTitan's Validator over a Zephon held-out loader instead of its built-in dataset."""

    def __init__(self, *, job_config: Any, dp_world_size: int, dp_rank: int, tokenizer: Any, parallel_dims: Any, loss_fn: Any,
                 validation_context: Any, maybe_enable_amp: Any, metrics_processor: Any = None, pp_schedule: Any = None,
                 pp_has_first_stage: bool | None = None, pp_has_last_stage: bool | None = None, **kwargs: Any) -> None:
        settings = settings_from(job_config)
        if not job_config.zephon.validation_recipe:
            raise IntegrationError("zephon: [validation] is enabled; set [zephon] validation_recipe to a held-out TOML data recipe")
        self.job_config = job_config
        self.tokenizer = tokenizer
        self.parallel_dims = parallel_dims
        self.loss_fn = loss_fn
        self.validation_dataloader = ZephonDataLoader022(
            ZephonStream(
                replace(settings, recipe=job_config.zephon.validation_recipe),
                dp_world_size=dp_world_size,
                dp_rank=dp_rank,
                tokenizer=tokenizer,
                seq_len=job_config.validation.seq_len,
                local_batch_size=job_config.validation.local_batch_size,
                batches_per_step=None,
                validation=True,
            )
        )
        self.validation_context = validation_context
        self.maybe_enable_amp = maybe_enable_amp
        self.metrics_processor = metrics_processor
        self.pp_schedule = pp_schedule
        self.pp_has_first_stage = pp_has_first_stage
        self.pp_has_last_stage = pp_has_last_stage


def build_zephon_validator(**kwargs: Any) -> ZephonValidator:
    return ZephonValidator(**kwargs)


class ZephonMetricsProcessor022(MetricsLogging, MetricsProcessor):
    """TorchTitan 0.2's ``MetricsProcessor``, logging Zephon's figures too when ``[zephon] log_metrics`` is on."""


def build_zephon_metrics_processor(job_config: Any, parallel_dims: Any, model_args: Any = None,
                                   tag: str | None = None) -> ZephonMetricsProcessor022:
    """The train spec's metrics processor: TorchTitan's, plus Zephon's figures when asked for (else nothing more)."""
    settings_from(job_config)  # type-checks [zephon] log_metrics with the rest
    processor = ZephonMetricsProcessor022(job_config, parallel_dims, tag)
    if job_config.zephon.log_metrics:
        processor.zephon = TrainingMetrics()
    return processor


def register() -> list[str]:
    """Register ``<model>_zephon`` for each base model that exists; idempotent."""
    names = []
    for base in BASE_MODELS:
        name = f"{base}_zephon"
        try:
            spec = get_train_spec(base)
        except Exception:  # a model this TorchTitan build does not have
            continue
        try:
            # A model with a metrics processor of its own keeps it (and logs no Zephon figures).
            metrics_fn = spec.build_metrics_processor_fn or build_zephon_metrics_processor
            zephon_spec = replace(spec, build_dataloader_fn=build_zephon_dataloader,
                                  build_validator_fn=build_zephon_validator, build_metrics_processor_fn=metrics_fn)
            register_train_spec(name, zephon_spec)
        except ValueError:  # already registered (module imported twice)
            pass
        names.append(name)
    return names


REGISTERED = register()
