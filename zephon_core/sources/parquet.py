"""Parquet documents, one row each, read by row group."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon_core.errors import DataError
from zephon_core.sources.base import Source, content_fingerprint, default_name, open_fs

_CACHED_ROW_GROUPS = 4


class ParquetSource(Source):
    """Rows of one Parquet file; a document is the ``text_field`` column's string."""

    def __init__(self, path: str, text_field: str = "text", *, name: str | None = None, storage_options: dict[str, Any] | None = None) -> None:
        import pyarrow.parquet as pq

        self.path = str(path)
        self.text_field = text_field
        self.name = name or default_name(self.path)
        self._fs, self._fspath = open_fs(self.path, storage_options)
        self._fingerprint = {"kind": "parquet", "text_field": text_field, **content_fingerprint(self._fs, self._fspath)}
        try:
            self._file = pq.ParquetFile(self._fs.open(self._fspath, "rb"))
        except Exception as e:  # pyarrow raises several unrelated types for a bad file
            raise DataError(f"{self.path}: not a readable Parquet file ({e})") from None
        schema = self._file.schema_arrow
        if text_field not in schema.names:
            raise DataError(f"{self.path}: no column {text_field!r} (columns: {', '.join(schema.names)})")
        import pyarrow as pa

        col_type = schema.field(text_field).type
        if not (pa.types.is_string(col_type) or pa.types.is_large_string(col_type)):
            raise DataError(f"{self.path}: column {text_field!r} must be a string column, got {col_type}")
        meta = self._file.metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self._group_starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self._lock = threading.Lock()
        self._groups: OrderedDict[int, list[Any]] = OrderedDict()
        self._require_nonempty(self.path)

    def __len__(self) -> int:
        return int(self._group_starts[-1])

    def _group(self, g: int) -> list[Any]:
        with self._lock:
            if g in self._groups:
                self._groups.move_to_end(g)
                return self._groups[g]
            try:
                values = self._file.read_row_group(g, columns=[self.text_field]).column(0).to_pylist()
            except Exception as e:  # pyarrow raises several unrelated types for corrupt data
                raise DataError(f"{self.path}: row group {g}: cannot read column {self.text_field!r} ({type(e).__name__}: {e})") from None
            self._groups[g] = values
            if len(self._groups) > _CACHED_ROW_GROUPS:
                self._groups.popitem(last=False)
            return values

    def read(self, indices: Sequence[int]) -> list[Any]:
        out = []
        for i in indices:
            g = int(np.searchsorted(self._group_starts, i, side="right") - 1)
            value = self._group(g)[i - int(self._group_starts[g])]
            if value is None:
                raise DataError(f"{self.path}: row {i}: field {self.text_field!r} is null")
            out.append(value)
        return out

    def fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)
