"""Arrow IPC documents, one row each: what Hugging Face ``datasets`` writes (``save_to_disk``, its
cache files) and the ``.arrow`` files of a Hub dataset repo (``hf://datasets/...``).

``datasets`` writes the IPC *stream* format (messages end to end, no footer); the IPC *file*
format (``ARROW1``, the same messages, a footer) is read the same way: one pass over a file's
message headers finds every record batch's byte span and row count (the file's index, which
``zephon index`` stores next to the data, so that start-up from a manifest opens no file), and
a document is then read from its record batch alone.

A local file (or a shard-cache copy) is memory-mapped: a batch is a zero-copy slice of the map.
On an object store a batch is one verified, retried range read of its message through the byte
layer's page pool (``byte_access.open_bytes``), not a copy of the whole shard: with a manifest a
rank fetches only the batches of the documents it is given, where a whole-shard copy would fetch
every shard it touches (``save_to_disk`` writes 500 MB shards) before its first document.
``Access(local_copy=True)`` copies whole shards instead. Without a manifest, indexing an object
takes one pass over it (a stream has no footer), and the index is kept in the index cache under the
file's version, as a JSONL file's index is (``indexed_file.IndexedFile``).

Nothing is unpickled: the text column must be an Arrow string column, and pyarrow reads a
pickled extension type as its storage bytes. The message index is parsed by ``arrow_ipc``.
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from fsspec.core import url_to_fs

from zephon_core.arrays import distinct
from zephon_core.errors import DataError
from zephon_core.io.files import Access, FileStat
from zephon_core.io.remote import LocalBytes, ScanStream
from zephon_core.sources.arrow_ipc import INDEX_KEYS, damage, plausible, read_schema, scan_messages
from zephon_core.sources.indexed_file import IndexedFile
from zephon_core.sources.registry import register_format
from zephon_core.sources.sharded import TextShardedSource

if TYPE_CHECKING:
    import pyarrow as pa

_CACHED_BATCHES = 4
_FILE_MAGIC = b"ARROW1"  # the IPC file format: magic, 2 bytes of padding, the stream, the footer, its length, magic
_STREAM_AT = {True: 8, False: 0}  # where the messages start, by whether the file has the magic
STATE, DATASET_DICT = "state.json", "dataset_dict.json"  # what datasets' save_to_disk writes next to the data
_SAVED_NAME = re.compile(r"data-\d{5}-of-(\d{5})\.arrow")


class ArrowFile(IndexedFile):
    """The rows of one Arrow IPC file (stream or file format); a document is the ``text_field`` column's string.

    Its index is the message index (``arrow_ipc.INDEX_KEYS``: a span per record batch, not per document),
    from a manifest, the index cache or one scan; the rows are read from a record batch at a time.
    """

    kind = "arrow"

    def __init__(self, path: str, text_field: str = "text", **where: Any) -> None:
        self.text_field = text_field
        super().__init__(path, **where)

    def options(self) -> dict[str, Any]:
        return {"text_field": self.text_field}

    def _open(self, access: Access, index: dict[str, np.ndarray] | None, stat: FileStat | None,
              whole: bytes | None) -> None:
        import pyarrow as pa

        self._map: pa.Buffer | None = None
        if isinstance(self._bytes, LocalBytes):  # a local file or a shard-cache copy: its batches are slices of the map
            with pa.memory_map(self._bytes.path) as mapped:
                self._map = mapped.read_buffer()  # the mapping outlives the closed file: no descriptor per shard
        super()._open(access, index, stat, whole)
        self._schema = read_schema(self._span(*self._index["schema"].tolist()), self.text_field, self.path,
                                   "the schema message (rebuild the manifest: zephon index)")
        self._column = int(self._schema.get_field_index(self.text_field))
        self._starts = np.concatenate([[0], np.cumsum(self._index["rows"])]).astype(np.int64)
        self._lock = threading.Lock()
        self._batches: OrderedDict[int, pa.Array] = OrderedDict()

    def _plausible(self, arrays: dict[str, np.ndarray]) -> bool:
        return plausible(arrays, int(self._fingerprint["size"]))

    def _span(self, start: int, length: int) -> pa.Buffer:
        import pyarrow as pa

        if self._map is not None:
            return self._map.slice(start, length)
        (data,) = self._bytes.read_many([(start, length)])  # verified, retried, through the page pool
        return pa.py_buffer(data)

    def _build_index(self, whole: bytes | None = None) -> dict[str, np.ndarray]:
        """Index the file's messages: from the map, from the bytes fetched whole, or in one pass over the object."""
        import pyarrow as pa

        size = int(self._fingerprint["size"])
        data = self._map if self._map is not None else pa.py_buffer(whole) if whole is not None else None

        def part(start: int, length: int) -> bytes:
            return data.slice(start, length).to_pybytes() if data is not None else self._bytes.scan(start, length)

        is_file = part(0, min(8, size)).startswith(_FILE_MAGIC)
        end = size
        if is_file:
            tail = part(max(0, size - 10), min(10, size))
            if size < 18 or not tail.endswith(_FILE_MAGIC):
                raise DataError(f"{self.path}: an Arrow IPC file without its footer (truncated?): rewrite it")
            end = size - 10 - int.from_bytes(tail[:4], "little", signed=True)  # the footer follows the messages
            if not 8 <= end <= size - 10:
                raise DataError(f"{self.path}: an Arrow IPC file whose footer length ({size - 10 - end} bytes) does "
                                f"not fit its {size} bytes: corrupt, rewrite it")
        if data is not None:
            stream: pa.NativeFile = pa.BufferReader(data.slice(0, end))
            stream.seek(_STREAM_AT[is_file])
        else:  # one pass, in large verified reads that bypass the page pool
            stream = pa.PythonFile(io.BufferedReader(ScanStream(self._bytes), 1 << 22), mode="r")
            stream.read(_STREAM_AT[is_file])
        return scan_messages(stream, end, self.text_field, self.path)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def byte_lengths(self) -> np.ndarray | None:
        """None: a document's bytes are not stored apart (the index spans record batches of many rows)."""
        return None

    def _batch(self, b: int) -> pa.Array:
        with self._lock:
            if b in self._batches:
                self._batches.move_to_end(b)
                return self._batches[b]
        column = self._decode(b)  # outside the lock: threads decode different batches at once
        with self._lock:
            self._batches[b] = column
            if len(self._batches) > _CACHED_BATCHES:
                self._batches.popitem(last=False)
        return column

    def _decode(self, b: int) -> pa.Array:
        import pyarrow as pa

        first, stop = int(self._starts[b]), int(self._starts[b + 1])
        where = f"{self.path}: record batch {b} (records {first}-{stop - 1})"
        buffer = self._span(int(self._index["offsets"][b]), int(self._index["lengths"][b]))
        try:
            message = pa.ipc.read_message(buffer)
            batch = pa.ipc.read_record_batch(message, self._schema)
            column = batch.column(self._column)
            column.validate(full=True)  # offsets in bounds, valid UTF-8: a corrupt file never reads as text
        except DataError:
            raise
        except damage() as e:
            raise DataError(f"{where}: cannot read column {self.text_field!r} ({type(e).__name__}: {e})") from None
        if batch.num_rows != stop - first:
            raise DataError(f"{where}: {batch.num_rows} records, but the index says {stop - first}; rebuild the manifest (zephon index)")
        return column

    def read(self, indices: Sequence[int]) -> list[Any]:
        idx = np.asarray(indices, dtype=np.int64)
        batches = np.searchsorted(self._starts, idx, side="right") - 1
        kinds = distinct(batches)
        if len(kinds) == 1:
            return self._values(int(kinds[0]), idx)
        out: list[Any] = [None] * len(idx)
        for b in kinds:
            where = np.flatnonzero(batches == b)
            for j, value in zip(where.tolist(), self._values(int(b), idx[where])):
                out[j] = value
        return out

    def _values(self, b: int, idx: np.ndarray) -> list[Any]:
        """The documents ``idx`` (all in record batch ``b``), in order."""
        local = idx - self._starts[b]
        column = self._batch(b)
        if len(local) and local[-1] - local[0] == len(local) - 1 and np.all(np.diff(local) == 1):
            values = column.slice(int(local[0]), len(local)).to_pylist()  # a run: half the cost of a take
        else:
            values = column.take(local).to_pylist()
        if None in values:
            j = values.index(None)
            raise DataError(f"{self.path}: record {int(idx[j])} (record batch {b}): field {self.text_field!r} is null")
        return values


def saved_split(path: str | Sequence[str], storage_options: dict[str, Any] | None) -> tuple[str | Sequence[str], list[str] | None]:
    """The files of ``path`` where it is a folder ``save_to_disk`` wrote (a ``Dataset``, or one split of a
    ``DatasetDict``): a spec of exactly the files its ``state.json`` lists, and their names; else ``(path, None)``.

    ``load_from_disk`` reads those files in ``state.json``'s order, and never the cache files that
    ``Dataset.map`` leaves beside them (``cache-*.arrow``), so neither does this source.
    """
    if not isinstance(path, str) or path.endswith(ArrowSource.suffixes) or set("*?[") & set(path):
        return path, None
    fs, folder = url_to_fs(path, **(storage_options or {}))
    folder = folder.rstrip("/")
    url = fs.unstrip_protocol(f"{folder}/{STATE}")
    try:
        raw = fs.cat_file(f"{folder}/{STATE}")
    except (FileNotFoundError, NotADirectoryError):
        try:
            splits = json.loads(fs.cat_file(f"{folder}/{DATASET_DICT}")).get("splits")
        except (FileNotFoundError, NotADirectoryError, ValueError, AttributeError):
            return path, None
        raise DataError(f"{path}: a DatasetDict folder (splits {', '.join(map(str, splits or []))}): name one split's folder, "
                        f"e.g. {path.rstrip('/')}/{(splits or ['train'])[0]}") from None
    try:
        names = [str(entry["filename"]) for entry in json.loads(raw)["_data_files"]]
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{url}: not a datasets state.json ({type(e).__name__}: {e})") from None
    if not names or any("/" in n or not n.endswith(".arrow") for n in names):
        raise DataError(f"{url}: _data_files must name the folder's .arrow files, got {names[:3]}")
    if names != sorted(names):
        first = next(a for a, b in zip(names, names[1:]) if a > b)
        raise DataError(f"{url}: lists {first} before a file whose name sorts first; a source reads its files in sorted "
                        "order, which would not be load_from_disk's: rename the files in state.json's order")
    totals = {m.group(1) if (m := _SAVED_NAME.fullmatch(n)) else None for n in names}
    total = next(iter(totals))
    if len(totals) == 1 and total is not None and int(total) == len(names):
        return f"{path.rstrip('/')}/data-*-of-{total}.arrow", names  # a glob: a manifest of it is the file set on a store
    return [f"{path.rstrip('/')}/{n}" for n in names], names


@register_format
class ArrowSource(TextShardedSource):
    """Arrow IPC rows (the ``.arrow`` files of Hugging Face ``datasets``) from one file, a glob, a folder or a
    list of them; files in sorted order.

    A folder that ``save_to_disk`` wrote (``state.json``) is exactly the files that state.json lists, as
    ``datasets.load_from_disk`` reads them; a ``DatasetDict`` folder is refused: name a split
    (``ds/train``). A document is the ``text_field`` column's string. For many files the folder's
    manifest is used when present (each file's message index is stored with it), otherwise every
    file's message headers are read on up to 16 threads.
    """

    format_name = "arrow"
    kind = "arrow"
    suffixes = (".arrow",)
    index_keys = INDEX_KEYS
    file_class = ArrowFile

    def __init__(self, path: str | Sequence[str], text_field: str = "text", *, name: str | None = None,
                 storage_options: dict[str, Any] | None = None, attempts: int = 5, local_copy: bool = False,
                 use_manifest: bool = True, access: Access | None = None) -> None:
        self.text_field = text_field
        spec, names = saved_split(path, storage_options)
        self._init_files(spec, name, storage_options, access or Access(attempts=attempts, local_copy=local_copy, manifest=use_manifest))
        if names is not None and self.files.listed and [self.files.name(st) for st in self.files.files] != names:
            missing = sorted(set(names) - {self.files.name(st) for st in self.files.files})
            raise DataError(f"{path}: state.json lists {len(names)} files, the folder holds {len(names) - len(missing)} of them "
                            f"({missing[0] if missing else '?'} is missing)")
