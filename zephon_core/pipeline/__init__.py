"""The pipeline a rank builds: operators and options (``builder``, ``options``), running it
(``engine``) and its plan (``plan``, which ``explain()`` prints)."""

from zephon_core.pipeline.builder import Pipeline
from zephon_core.pipeline.options import DEFAULT_AGGREGATE_TIMEOUT_S, Identity, Options
from zephon_core.pipeline.plan import Plan

__all__ = ["DEFAULT_AGGREGATE_TIMEOUT_S", "Identity", "Options", "Pipeline", "Plan"]
