"""JSON Lines documents, read by byte offset: one file (``JsonlFile``) or many (``JsonlSource``).

Compressed shards (``.jsonl.gz``, ``.jsonl.zst``) are read through
``byte_access.open_bytes`` like every format's files: decompressed once, whole,
into the node-local shard cache, and read from there by byte offset.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon_core.errors import DataError
from zephon_core.io.files import Access
from zephon_core.io.remote import iter_bytes
from zephon_core.sources.base import SET_TEXT_FIELD
from zephon_core.sources.indexed_file import IndexedFile
from zephon_core.sources.registry import register_format
from zephon_core.sources.sharded import TextShardedSource

_READ_BLOCK = 1 << 22
SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")


class JsonlFile(IndexedFile):
    """One JSON Lines file (plain, ``.gz`` or ``.zst``; local or on an object store).

    With ``text_field`` set (the default ``"text"``) a document is that field's
    string; with ``text_field=None`` it is the whole object. The byte-offset
    index is built once (every line is parsed and checked then, so a malformed
    line fails at start-up, naming its line number) and cached under
    ``cache_dir`` (default ``$ZEPHON_CACHE_DIR`` or ``~/.cache/zephon/index``).
    Blank lines are skipped.
    """

    kind = "jsonl"

    def __init__(self, path: str, text_field: str | None = "text", **where: Any) -> None:
        self.text_field = text_field
        super().__init__(path, **where)

    def options(self) -> dict[str, Any]:
        return {"text_field": self.text_field}

    def _plausible(self, arrays: dict[str, np.ndarray]) -> bool:
        """An index must describe this file: ordered, in bounds, ending at its last record."""
        try:
            starts, lengths, lines = arrays["starts"], arrays["lengths"], arrays["lines"]
        except KeyError:
            return False
        n = len(starts)
        if n == 0 or len(lengths) != n or len(lines) != n or any(a.dtype != np.int64 for a in (starts, lengths, lines)):
            return False
        ends = starts + lengths
        if starts[0] < 0 or np.any(lengths <= 0) or np.any(starts[1:] <= ends[:-1]) or np.any(np.diff(lines) <= 0):
            return False
        if int(ends[-1]) > self._bytes.size:
            return False
        (tail,) = self._bytes.read_many([(int(ends[-1]), self._bytes.size - int(ends[-1]))])  # only whitespace may follow
        return not tail.strip()

    def _build_index(self, whole: bytes | None = None) -> dict[str, np.ndarray]:
        starts: list[int] = []
        lengths: list[int] = []
        lines: list[int] = []
        offset = 0
        lineno = 0
        carry = b""
        blocks = iter_bytes(self._bytes, _READ_BLOCK) if whole is None else iter([whole])
        while True:
            block = next(blocks, b"")
            if not block and not carry:
                break
            data = carry + block
            if block:
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    carry = data
                    continue
                data, carry = data[:cut], data[cut:]
            else:
                carry = b""
            pos = 0
            # Only "\n" ends a record: a lone "\r" is whitespace inside JSON.
            for raw in (data[:-1] if data.endswith(b"\n") else data).split(b"\n"):
                lineno += 1
                body = raw[:-1] if raw.endswith(b"\r") else raw
                if body.strip():
                    self._parse(body, lineno)
                    starts.append(offset + pos)
                    lengths.append(len(body))
                    lines.append(lineno)
                pos += len(raw) + 1
            offset += pos
        return {
            "starts": np.asarray(starts, dtype=np.int64),
            "lengths": np.asarray(lengths, dtype=np.int64),
            "lines": np.asarray(lines, dtype=np.int64),
        }

    def _parse(self, body: bytes, lineno: int) -> Any:
        where = f"{self.path}:{lineno}"
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{where}: not valid UTF-8 (byte {e.start} of the line)") from None
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None
        if self.text_field is None:
            return record
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
        if self.text_field not in record:
            raise DataError(f"{where}: missing field {self.text_field!r}{SET_TEXT_FIELD}", recipe_key="text_field")
        value = record[self.text_field]
        if not isinstance(value, str):
            raise DataError(f"{where}: field {self.text_field!r} must be a string, got {type(value).__name__}")
        return value

    def read(self, indices: Sequence[int]) -> list[Any]:
        lines = self._index["lines"]
        return [self._parse(raw, int(lines[i])) for raw, i in zip(self._spans(indices), indices)]


@register_format
class JsonlSource(TextShardedSource):
    """JSON Lines documents from one file, a glob (``"data/*.jsonl.gz"``), a folder (its ``.jsonl``,
    ``.jsonl.gz`` and ``.jsonl.zst`` files, recursively) or a list of them; files in sorted order.

    A single file keeps the single-file fingerprint. For many files, the folder's
    ``zephon-manifest.json`` (``zephon index``) is used when present (one read;
    on a file system checked against one listing, on S3 each read checks the
    object's version against it); otherwise every file is indexed on up to 16
    threads and the indexes are cached. See docs/sources_at_scale.md.
    """

    format_name = "jsonl"
    kind = "jsonl"
    suffixes = SUFFIXES
    index_keys = ("starts", "lengths", "lines")
    file_class = JsonlFile

    def __init__(self, path: str | Sequence[str], text_field: str | None = "text", *, name: str | None = None,
                 cache_dir: str | None = None, storage_options: dict[str, Any] | None = None, attempts: int = 5,
                 local_copy: bool = False, cache_bytes: int | None = None, use_manifest: bool = True, access: Access | None = None) -> None:
        self.text_field = text_field  # type: ignore[assignment]  # None: a document is the whole object
        access = access or Access(attempts, None if cache_dir is None else str(cache_dir), cache_bytes, local_copy, use_manifest)
        self._init_files(path, name, storage_options, access)
