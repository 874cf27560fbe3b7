"""Random-access document sources."""

from zephon_core.sources.base import Source
from zephon_core.sources.jsonl import JsonlSource
from zephon_core.sources.memory import MemorySource
from zephon_core.sources.parquet import ParquetSource
from zephon_core.sources.tokens import MegatronIndexedSource, TokenArraySource

__all__ = ["Source", "JsonlSource", "MemorySource", "ParquetSource", "TokenArraySource", "MegatronIndexedSource"]
