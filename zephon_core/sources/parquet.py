"""Parquet documents, one row each, read by row group.

pyarrow reads a file through ``byte_access.ByteFile``: its footer and column chunks are the
byte layer's verified, retried range reads (on a store, each checked against the version the
listing or manifest recorded), like every format's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon_core.errors import DataError
from zephon_core.io.byte_access import ByteFile
from zephon_core.io.files import Access, FileStat
from zephon_core.sources.base import SET_TEXT_FIELD
from zephon_core.sources.indexed_file import StoredFile
from zephon_core.sources.registry import register_format
from zephon_core.sources.sharded import TextShardedSource

_CACHED_ROW_GROUPS = 4


class ParquetFile(StoredFile):
    """Rows of one Parquet file; a document is the ``text_field`` column's string. Its footer (read at
    start-up, from the bytes fetched whole for a small object on a store) says where each row group is."""

    kind = "parquet"

    def __init__(self, path: str, text_field: str = "text", **where: Any) -> None:
        self.text_field = text_field
        super().__init__(path, **where)

    def options(self) -> dict[str, Any]:
        return {"text_field": self.text_field}

    def _open(self, access: Access, index: dict[str, np.ndarray] | None, stat: FileStat | None,
              whole: bytes | None) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            reader = pa.BufferReader(whole) if whole is not None else ByteFile(self._bytes, self.path)
            self._file = pq.ParquetFile(reader)
        except DataError:
            raise
        except Exception as e:  # pyarrow raises several unrelated types for a bad file
            raise DataError(f"{self.path}: not a readable Parquet file ({e})") from None
        schema = self._file.schema_arrow
        if self.text_field not in schema.names:
            columns = ", ".join(schema.names)
            raise DataError(f"{self.path}: no column {self.text_field!r} (columns: {columns}){SET_TEXT_FIELD}",
                            recipe_key="text_field")
        col_type = schema.field(self.text_field).type
        if not (pa.types.is_string(col_type) or pa.types.is_large_string(col_type)):
            raise DataError(f"{self.path}: column {self.text_field!r} must be a string column, got {col_type}")
        meta = self._file.metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self._group_starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self._lock = threading.Lock()
        self._groups: OrderedDict[int, list[Any]] = OrderedDict()

    def __len__(self) -> int:
        return int(self._group_starts[-1])

    def _group(self, g: int) -> list[Any]:
        with self._lock:
            if g in self._groups:
                self._groups.move_to_end(g)
                return self._groups[g]
            values = self._read_group(g)
            self._groups[g] = values
            if len(self._groups) > _CACHED_ROW_GROUPS:
                self._groups.popitem(last=False)
            return values

    def _read_group(self, g: int) -> list[Any]:
        # Transient store failures were retried by the byte layer; what reaches here is final.
        try:
            return list(self._file.read_row_group(g, columns=[self.text_field]).column(0).to_pylist())
        except DataError:
            raise
        except Exception as e:  # pyarrow raises several unrelated types for corrupt data
            raise DataError(f"{self.path}: row group {g}: cannot read column {self.text_field!r} ({type(e).__name__}: {e})") from None

    def read(self, indices: Sequence[int]) -> list[Any]:
        out = []
        for i in indices:
            g = int(np.searchsorted(self._group_starts, i, side="right") - 1)
            value = self._group(g)[i - int(self._group_starts[g])]
            if value is None:
                raise DataError(f"{self.path}: row {i}: field {self.text_field!r} is null")
            out.append(value)
        return out


@register_format
class ParquetSource(TextShardedSource):
    """Parquet rows from one file, a glob (``"s3://bucket/fineweb/*.parquet"``), a folder (its
    ``.parquet`` files, recursively) or a list of them; files in sorted order.

    A document is the ``text_field`` column's string. For many files the folder's
    manifest is used when present, otherwise every file's footer is read on up to
    16 threads. See docs/sources_at_scale.md.
    """

    format_name = "parquet"
    kind = "parquet"
    suffixes = (".parquet",)
    file_class = ParquetFile

    def __init__(self, path: str | Sequence[str], text_field: str = "text", *, name: str | None = None,
                 cache_dir: str | None = None, storage_options: dict[str, Any] | None = None, attempts: int = 5,
                 local_copy: bool = False, cache_bytes: int | None = None, use_manifest: bool = True,
                 access: Access | None = None) -> None:
        self.text_field = text_field
        cache = None if cache_dir is None else str(cache_dir)
        access = access or Access(attempts, cache, cache_bytes, local_copy, use_manifest)
        self._init_files(path, name, storage_options, access)
