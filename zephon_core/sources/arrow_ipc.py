"""Arrow IPC messages (the stream format, and the file format's messages before its footer) as an index: the
schema message's span and every record batch's byte span and row count, found in one pass over the message
headers. A message that does not parse is a ``DataError`` naming the file, the byte and the record batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from zephon_core.errors import DataError
from zephon_core.sources.base import SET_TEXT_FIELD

if TYPE_CHECKING:
    import pyarrow as pa

INDEX_KEYS = ("schema", "offsets", "lengths", "rows")


def check_schema(schema: pa.Schema, text_field: str, where: str, names: list[str] | None = None) -> int:
    """The position of the string column ``text_field`` in ``schema``; a ``DataError`` naming the file and column
    otherwise."""
    import pyarrow as pa

    names = schema.names if names is None else names
    if text_field not in names:
        raise DataError(f"{where}: no column {text_field!r} (columns: {', '.join(names)}){SET_TEXT_FIELD}",
                        recipe_key="text_field")
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{where}: column {text_field!r} must be a string column, got {kind}")
    return int(schema.get_field_index(text_field))


def damage() -> tuple[type[BaseException], ...]:
    """What pyarrow raises for damaged IPC bytes: its own types (``ArrowInvalid``, ``ArrowNotImplementedError`` for a
    type code it does not know, ``ArrowIndexError``...), and ``OSError`` for lengths past the end."""
    import pyarrow as pa

    return (pa.ArrowException, OSError, EOFError, ValueError, IndexError)


def read_schema(message: pa.Message | pa.Buffer, text_field: str, path: str, where: str) -> pa.Schema:
    """The schema a schema message holds, its ``text_field`` checked (``check_schema``). A damaged message (a type
    pyarrow does not know, a field name that is not UTF-8...) is a ``DataError`` naming ``path``, then ``where``."""
    import pyarrow as pa

    try:
        schema = pa.ipc.read_schema(message if isinstance(message, pa.Message) else pa.ipc.read_message(message))
        names = schema.names  # decodes every field's name
    except damage() as e:
        raise DataError(f"{path}: {where}: unreadable, truncated or corrupt ({type(e).__name__}: {e})") from None
    check_schema(schema, text_field, path, names)
    return schema


def scan_messages(stream: pa.NativeFile, end: int, text_field: str, where: str) -> dict[str, np.ndarray]:
    """The index of the IPC messages ``stream`` holds up to byte ``end``: the schema message's span and every
    record batch's byte offset, length and rows. A message that does not parse is a ``DataError`` naming
    the file, the byte and the batch."""
    import pyarrow as pa

    reader = pa.ipc.MessageReader.open_stream(stream)
    schema_span: list[int] = []
    offsets: list[int] = []
    lengths: list[int] = []
    rows: list[int] = []
    schema = None
    pos = stream.tell()
    while pos < end:
        what = f"record batch {len(offsets)} (after {sum(rows)} records)" if schema is not None else "the schema"
        try:
            message = reader.read_next_message()
        except StopIteration:
            break
        except damage() as e:
            raise DataError(f"{where}: byte {pos}, {what}: not a readable Arrow IPC message, truncated or corrupt "
                            f"({e})") from None
        after = stream.tell()
        if message.type == "schema" and schema is None:
            schema = read_schema(message, text_field, where, f"byte {pos}, the schema")
            schema_span = [pos, after - pos]
        elif message.type == "record batch" and schema is not None:
            try:
                n = pa.ipc.read_record_batch(message, schema).num_rows
            except damage() as e:
                raise DataError(f"{where}: byte {pos}, {what}: unreadable, truncated or corrupt "
                                f"({type(e).__name__}: {e})") from None
            offsets.append(pos)
            lengths.append(after - pos)
            rows.append(n)
        elif message.type == "dictionary":
            raise DataError(f"{where}: byte {pos}: dictionary-encoded columns are not supported; write the dataset "
                            "without them")
        else:
            raise DataError(f"{where}: byte {pos}, {what}: unexpected Arrow IPC message {message.type!r}")
        pos = after
    if schema is None:
        raise DataError(f"{where}: not an Arrow IPC file (no schema message)")
    return {"schema": np.asarray(schema_span, dtype=np.int64), "offsets": np.asarray(offsets, dtype=np.int64),
            "lengths": np.asarray(lengths, dtype=np.int64), "rows": np.asarray(rows, dtype=np.int64)}


def plausible(arrays: dict[str, np.ndarray], size: int) -> bool:
    """An index (a manifest's) must describe a file of ``size`` bytes: spans in order and in bounds."""
    if any(k not in arrays or arrays[k].dtype != np.int64 for k in INDEX_KEYS) or arrays["schema"].shape != (2,):
        return False
    offsets, lengths, rows = arrays["offsets"], arrays["lengths"], arrays["rows"]
    if not (len(offsets) == len(lengths) == len(rows)) or np.any(lengths <= 0) or np.any(rows < 0):
        return False
    spans = np.concatenate([arrays["schema"].reshape(1, 2), np.stack([offsets, lengths], axis=1)])
    return bool(spans[0, 0] >= 0 and np.all(spans[1:, 0] >= spans[:-1].sum(axis=1)) and spans[-1].sum() <= size)
