"""Every byte of a small Arrow file flipped: the source reads it intact, refuses it in one line naming the file
(docs/formats.md's promise), or reads a changed value that no reader could tell from a real one, and then only
where the flipped byte lies inside one of the text column's buffers (structurally valid data)."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import datasets
import pyarrow as pa
import pytest
from support.core_fixtures import zephon_cache_dir  # noqa: F401  (autouse: a private index cache per test)

from zephon_core import ArrowSource, DataError

datasets.disable_progress_bars()
TEXTS = [f"d{j}:" + "abcdef"[: j % 5] for j in range(7)]


def written(kind: str, folder: Path) -> bytes:
    """A small file as ``datasets`` writes it (stream format, its schema carrying datasets' metadata) or as pyarrow
    writes the stream and the file (``ARROW1``, with a footer) formats: 7 rows in record batches of 3."""
    table = pa.table({"text": TEXTS, "n": list(range(len(TEXTS)))})
    if kind == "datasets":
        with mock.patch.object(datasets.config, "DEFAULT_MAX_BATCH_SIZE", 3):
            datasets.Dataset(table).save_to_disk(str(folder / "ds"))
        return (folder / "ds" / "data-00000-of-00001.arrow").read_bytes()
    sink = pa.BufferOutputStream()
    with (pa.ipc.new_file if kind == "file" else pa.ipc.new_stream)(sink, table.schema) as w:
        for b in table.to_batches(max_chunksize=3):
            w.write_batch(b)
    return bytes(sink.getvalue().to_pybytes())


def text_buffers(data: bytes) -> set[int]:
    """The byte positions of the text column's buffers (validity, offsets, characters) in every record batch."""
    base = pa.py_buffer(data)
    if data.startswith(b"ARROW1"):
        filed = pa.ipc.open_file(base)
        batches = [filed.get_batch(i) for i in range(filed.num_record_batches)]
    else:
        batches = list(pa.ipc.open_stream(base))
    out: set[int] = set()
    for batch in batches:
        for buf in batch.column(0).buffers():
            if buf is not None:
                start = buf.address - base.address
                assert 0 <= start <= len(data) - buf.size, "read in place: the buffers are slices of the file"
                out.update(range(start, start + buf.size))
    return out


def outcome(path: Path) -> str:
    try:
        src = ArrowSource(str(path), "text")
        got = src.read(list(range(len(src))))
    except DataError as e:
        msg = str(e)
        assert msg.startswith(f"{path}: ") and "\n" not in msg, msg
        return "refused"
    return "intact" if got == TEXTS else "changed"


@pytest.mark.parametrize("kind", ["datasets", "stream", "file"])
def test_every_flipped_byte_is_read_intact_refused_naming_the_file_or_a_valid_text_value(tmp_path, kind):
    data = written(kind, tmp_path)
    buffers = text_buffers(data)
    path = tmp_path / "flipped.arrow"
    seen: dict[str, list[int]] = {"intact": [], "refused": [], "changed": []}
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 0xFF
        path.write_bytes(bytes(flipped))
        seen[outcome(path)].append(i)  # any other exception fails the test: a raw pyarrow error names no file
    assert seen["refused"] and seen["intact"], {k: len(v) for k, v in seen.items()}
    outside = sorted(set(seen["changed"]) - buffers)
    assert not outside, f"values changed by flips outside the text column's buffers, at bytes {outside}"
