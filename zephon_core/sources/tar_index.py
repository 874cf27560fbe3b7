"""Walking a tar's headers, as WebDataset groups its members into samples: the parser ``webdataset``'s source
indexes a shard with (ustar, GNU long names and pax headers, every header checksummed, every text member
decoded). A sample is a run of consecutive members that share a key (``webdataset.tariterators.base_plus_ext``):
the key is a member's path up to the first dot of its base name, the extension the rest, lowercased.
Directories, links, ``__meta__`` members and names without an extension are no sample's members.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator

from zephon_core.errors import DataError
from zephon_core.io.byte_access import ByteReader

BLOCK = 512
_BLOCK = BLOCK  # the walk's own name for it
_ZERO = bytes(_BLOCK)
_WINDOW = 1 << 20  # the walk reads a tar this much at a time, jumping over members larger than that
_REGULAR = (b"0", b"\0", b"7")
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # WebDataset's base_plus_ext: (key, extension)
_META = re.compile(r"__[^/]*__($|/)")  # WebDataset's skip_meta: members that are no sample's


def _number(field: bytes) -> int:
    """A header number: octal text, or base-256 (GNU, for values too large for octal)."""
    if field[:1] in (b"\x80", b"\xff"):
        n = int.from_bytes(field[1:], "big")
        return n - 256 ** (len(field) - 1) if field[:1] == b"\xff" else n
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


class Window:
    """A reader's bytes at (mostly) increasing offsets, fetched a window at a time: a walk over a tar's headers."""

    def __init__(self, reader: ByteReader, whole: bytes | None) -> None:
        self._reader = reader
        self.size = len(whole) if whole is not None else reader.size
        self._start, self._buf = 0, whole if whole is not None else b""

    def get(self, start: int, length: int) -> bytes:
        if start < self._start or start + length > self._start + len(self._buf):
            self._start = start
            self._buf = self._reader.scan(start, min(max(length, _WINDOW), self.size - start))
        return self._buf[start - self._start : start - self._start + length]


class TarWalk:
    """The samples of one tar, checked member by member; every failure names the shard and where."""

    def __init__(self, window: Window, url: str, member: str) -> None:
        self.window, self.url, self.member = window, url, member

    def _damaged(self, pos: int, what: str) -> DataError:
        return DataError(f"{self.url}: damaged tar: {what} at byte {pos}; the shard is corrupt or not a tar, "
                         "rewrite it")

    def _sparse(self, pos: int) -> DataError:
        return DataError(f"{self.url}: the member at byte {pos} is a sparse file, which WebDataset shards never "
                         "hold; rewrite the shard")

    def _header(self, pos: int) -> tuple[str, int, bytes]:
        """Name, size and type of the header at ``pos``."""
        block = self.window.get(pos, _BLOCK)
        try:
            checksum = _number(block[148:156])
            name, size = _text(block[:100]), _number(block[124:136])
        except ValueError:
            raise self._damaged(pos, "a header with a malformed number") from None
        # The checksum counts its own field as spaces; some old writers summed signed bytes.
        unsigned = sum(block) - sum(block[148:156]) + 8 * 32
        if checksum != unsigned and checksum != sum(struct.unpack("148b8x356b", block)) + 8 * 32:
            raise self._damaged(pos, "a header that fails its checksum")
        kind = block[156:157]
        if block[257:265] == b"ustar\x0000" and block[345:346] != b"\0":  # POSIX ustar: a long path's prefix
            name = f"{_text(block[345:500])}/{name}"
        return name, size, kind

    def _pax(self, data: bytes, pos: int) -> dict[str, str]:
        records: dict[str, str] = {}
        i = 0
        try:
            while i < len(data) and data[i] != 0:
                space = data.index(b" ", i)
                length = int(data[i:space])
                key, eq, value = data[space + 1 : i + length - 1].partition(b"=")
                if length <= 0 or not eq or data[i + length - 1 : i + length] != b"\n":
                    raise ValueError
                records[key.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
                i += length
        except ValueError:
            raise self._damaged(pos, "a malformed pax header") from None
        if any(k.startswith("GNU.sparse") for k in records):
            raise self._sparse(pos)
        return records

    def _pax_size(self, value: str, pos: int) -> int:
        try:
            return int(value)
        except ValueError:
            raise self._damaged(pos, "a pax header with a malformed size") from None

    def members(self) -> Iterator[tuple[str, int, int]]:
        """(name, data offset, size) of every regular file, in order, to the end-of-archive marker."""
        pos, end_of_file = 0, self.window.size
        shared: dict[str, str] = {}  # pax global headers ("g"), for every member after them
        pending: dict[str, str] = {}  # pax ("x") and GNU long-name ("L") headers, for the next member
        while True:
            if end_of_file < _BLOCK:
                raise DataError(f"{self.url}: not a tar: {end_of_file} bytes, less than one tar header")
            if pos + _BLOCK > end_of_file:
                what = "it ends without the end-of-archive blocks" if pos == end_of_file else "a header is cut short"
                raise DataError(f"{self.url}: truncated tar: {what} at byte {pos}; the shard was cut short, "
                                "copy or write it again")
            if self.window.get(pos, _BLOCK) == _ZERO:
                return self._check_tail(pos)
            name, size, kind = self._header(pos)
            extended = kind in (b"x", b"g", b"L", b"K")
            if not extended:
                merged = {**shared, **pending}
                name, pending = merged.get("path", name), {}
                if "size" in merged:
                    size = self._pax_size(merged["size"], pos)
            if kind == b"S":
                raise self._sparse(pos)
            data = pos + _BLOCK
            if size < 0 or data + size > end_of_file:
                raise DataError(f"{self.url}: truncated tar: member {name!r} at byte {pos} has {size} bytes of data, "
                                f"the file ends at byte {end_of_file}; the shard was cut short, copy or write it again")
            if kind in (b"x", b"g"):
                (pending if kind == b"x" else shared).update(self._pax(self.window.get(data, size), pos))
            elif kind == b"L":
                pending["path"] = _text(self.window.get(data, size))
            elif kind in _REGULAR and not name.endswith("/"):
                yield name, data, size
            pos = data + -(-size // _BLOCK) * _BLOCK

    def _check_tail(self, pos: int) -> None:
        """Only zeros may follow the end-of-archive marker (a second archive after it would be lost)."""
        for start in range(pos, self.window.size, _WINDOW):
            if self.window.get(start, min(_WINDOW, self.window.size - start)).strip(b"\0"):
                raise DataError(f"{self.url}: data follows the tar's end-of-archive marker at byte {pos}: the shard "
                                "holds more than one archive (cat a.tar b.tar) or is damaged; write it as one tar")

    def samples(self) -> Iterator[tuple[str, int, int]]:
        """(key, data offset, size of its text member) of every sample, in order; its text checked as UTF-8."""
        key: str | None = None
        found: dict[str, tuple[int, int]] = {}
        seen: set[str] = set()
        for name, data, size in self.members():
            if ("/" not in name and name.startswith("__") and name.endswith("__")) or _META.match(name):
                continue
            m = _KEY.match(name)
            if m is None:
                continue
            if m.group(1) != key:
                if key is not None:
                    yield self._sample(key, found)
                key, found = m.group(1), {}
                if key in seen:
                    raise DataError(f"{self.url}: sample {key!r} appears again at member {name!r}, after other "
                                    "samples; a sample's members must be consecutive (as WebDataset groups them): "
                                    "write each sample's files together")
                seen.add(key)
            suffix = m.group(2).lower()
            if suffix in found:
                raise DataError(f"{self.url}: sample {key!r} has two .{suffix} members (the second: {name!r}); "
                                "rewrite the shard")
            found[suffix] = (data, size)
        if key is not None:
            yield self._sample(key, found)

    def _sample(self, key: str, found: dict[str, tuple[int, int]]) -> tuple[str, int, int]:
        if self.member not in found:
            has = ", ".join(f".{s}" for s in found)
            raise DataError(f"{self.url}: sample {key!r} has no .{self.member} member (its members: {has}); name "
                            "the member holding the text with the source's text_field, or rewrite the shard")
        data, size = found[self.member]
        decode(self.window.get(data, size), self.url, key, self.member)
        return key, data, size


def decode(raw: bytes, url: str, key: str, member: str) -> str:
    """A text member's bytes as text; a ``DataError`` naming the shard, the sample and the member where not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{url}: sample {key!r}: member .{member} is not valid UTF-8 (byte {e.start} of it)") from None
