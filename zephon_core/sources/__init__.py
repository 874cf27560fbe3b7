"""Random-access document sources; importing this package registers the bundled formats (``registry``)."""

from zephon_core.sources.base import Source
from zephon_core.sources.jsonl import JsonlSource
from zephon_core.sources.mds import MdsSource, MdsTokensSource
from zephon_core.sources.memory import MemorySource
from zephon_core.sources.parquet import ParquetSource
from zephon_core.sources.registry import FileSource, SourceArgs, register_format
from zephon_core.sources.tokens import TokenArraySource

# isort: split
# After token_array: imports register formats, and the registry's order is the order users see them listed in.
from zephon_core.sources.megatron import MegatronIndexedSource
from zephon_core.sources.webdataset import WebDatasetSource

# isort: split
# Imported last: formats register in import order, which messages list them in (the first four first).
from zephon_core.sources.arrow import ArrowSource

__all__ = ["Source", "FileSource", "SourceArgs", "register_format", "JsonlSource", "MemorySource", "ParquetSource",
           "TokenArraySource", "MegatronIndexedSource", "WebDatasetSource", "MdsSource", "MdsTokensSource", "ArrowSource"]
