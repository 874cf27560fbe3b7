"""zephon_core: deterministic, checkpointable, elastic data loading for distributed training.

Each data-parallel rank builds its own ``Pipeline`` and works out, without
communication, which samples it produces; pipelines coordinate only to
checkpoint. This package imports no torch.
"""

from zephon_core.batch import Batch, Cursor, Segment
from zephon_core.checkpoint.merge import diff_definitions, merge_states
from zephon_core.curriculum.mixture import StaticMixture
from zephon_core.curriculum.stages import Stage, StagedMixture
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.errors import AggregationError, ConfigError, DataError, StateError, ZephonError
from zephon_core.lane.assignment import owned_lanes
from zephon_core.lane.docops import token_counter
from zephon_core.pipeline import Pipeline
from zephon_core.sources import (
                                 ArrowSource,
                                 JsonlSource,
                                 MdsSource,
                                 MdsTokensSource,
                                 MegatronIndexedSource,
                                 MemorySource,
                                 ParquetSource,
                                 Source,
                                 TokenArraySource,
                                 WebDatasetSource,
)

__version__ = "0.1.0"

__all__ = [
    "AggregationError",
    "ArrowSource",
    "Batch",
    "ConfigError",
    "Cursor",
    "DataError",
    "JsonlSource",
    "MdsSource",
    "MdsTokensSource",
    "MegatronIndexedSource",
    "MemorySource",
    "ParquetSource",
    "Pipeline",
    "Segment",
    "Source",
    "Stage",
    "StagedMixture",
    "StateError",
    "StaticMixture",
    "TokenArraySource",
    "WebDatasetSource",
    "WorkSource",
    "ZephonError",
    "diff_definitions",
    "merge_states",
    "owned_lanes",
    "token_counter",
]
