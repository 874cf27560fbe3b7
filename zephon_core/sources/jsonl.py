"""JSON Lines documents, read by byte offset."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon_core.errors import DataError
from zephon_core.sources import index_cache
from zephon_core.sources.base import Source, content_fingerprint, default_name, is_local, open_fs

_READ_BLOCK = 1 << 22


class JsonlSource(Source):
    """One JSON object per line.

    With ``text_field`` set (the default ``"text"``) a document is that field's
    string; with ``text_field=None`` it is the whole object. The byte-offset
    index is built once (every line is parsed and checked then, so a malformed
    line fails at start-up, naming its line number) and cached under
    ``cache_dir`` (default ``$ZEPHON_CACHE_DIR`` or ``~/.cache/zephon/index``).
    Blank lines are skipped.
    """

    def __init__(
        self,
        path: str,
        text_field: str | None = "text",
        *,
        name: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.path = str(path)
        self.text_field = text_field
        self.name = name or default_name(self.path)
        self._fs, self._fspath = open_fs(self.path, storage_options)
        self._local = is_local(self._fs)
        self._fingerprint = {
            "kind": "jsonl",
            "text_field": text_field,
            **content_fingerprint(self._fs, self._fspath),
        }
        cache_file = index_cache.cache_path(
            index_cache.cache_root(cache_dir), self._fs.unstrip_protocol(self._fspath), f"jsonl:{text_field}"
        )
        # The cache is also keyed on the modification time: the content
        # fingerprint samples only the ends of a file, and an index must never
        # be reused for a file edited in the middle.
        try:
            mtime = self._fs.info(self._fspath).get("mtime") or self._fs.modified(self._fspath).timestamp()
        except (NotImplementedError, AttributeError, OSError):
            mtime = None
        cache_key = {**self._fingerprint, "mtime": str(mtime)}
        arrays = index_cache.load(cache_file, cache_key)
        if arrays is not None and not self._plausible(arrays):
            arrays = None
        if arrays is None:
            arrays = self._build_index()
            index_cache.store(cache_file, cache_key, arrays)
        self._starts = arrays["starts"]
        self._lengths = arrays["lengths"]
        self._lines = arrays["lines"]
        self._fd: int | None = None
        self._fd_lock = threading.Lock()
        self._require_nonempty(self.path)

    def _plausible(self, arrays: dict[str, np.ndarray]) -> bool:
        """A cached index must describe this file: ordered, in bounds, ending at its last record."""
        try:
            starts, lengths, lines = arrays["starts"], arrays["lengths"], arrays["lines"]
        except KeyError:
            return False
        n = len(starts)
        if n == 0 or len(lengths) != n or len(lines) != n or any(a.dtype != np.int64 for a in (starts, lengths, lines)):
            return False
        ends = starts + lengths
        size = int(self._fingerprint["size"])
        if starts[0] < 0 or np.any(lengths <= 0) or np.any(starts[1:] <= ends[:-1]) or ends[-1] > size or np.any(np.diff(lines) <= 0):
            return False
        with self._fs.open(self._fspath, "rb") as f:  # nothing but whitespace may follow the last record
            f.seek(int(ends[-1]))
            return not f.read(size - int(ends[-1])).strip()

    def _build_index(self) -> dict[str, np.ndarray]:
        starts: list[int] = []
        lengths: list[int] = []
        lines: list[int] = []
        offset = 0
        lineno = 0
        carry = b""
        with self._fs.open(self._fspath, "rb") as f:
            while True:
                block = f.read(_READ_BLOCK)
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
            raise DataError(f"{where}: missing field {self.text_field!r}")
        value = record[self.text_field]
        if not isinstance(value, str):
            raise DataError(f"{where}: field {self.text_field!r} must be a string, got {type(value).__name__}")
        return value

    def __len__(self) -> int:
        return len(self._starts)

    def _read_bytes(self, start: int, length: int) -> bytes:
        if self._local:
            if self._fd is None:
                with self._fd_lock:
                    if self._fd is None:
                        self._fd = os.open(self._fspath, os.O_RDONLY)
            return os.pread(self._fd, length, start)
        return self._fs.cat_file(self._fspath, start=start, end=start + length)

    def read(self, indices: Sequence[int]) -> list[Any]:
        out = []
        for i in indices:
            start, length = int(self._starts[i]), int(self._lengths[i])
            out.append(self._parse(self._read_bytes(start, length), int(self._lines[i])))
        return out

    def byte_lengths(self) -> np.ndarray:
        """Bytes of every record's line (the whole JSON object, not only its text field)."""
        return self._lengths

    def fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)
