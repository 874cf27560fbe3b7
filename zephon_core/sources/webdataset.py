"""WebDataset tar shards: one document per sample, its text the member the source names.

A sample is a run of consecutive tar members that share a key, as WebDataset groups them
(``webdataset.tariterators.base_plus_ext``): the key is a member's path up to the first dot
of its base name, the extension the rest, lowercased (``shard/000017.en.txt``: key
``shard/000017``, extension ``en.txt``). Directories, links, ``__meta__`` members and names
without an extension are not members of a sample, as in WebDataset.

A shard's index (the byte offset and length of each sample's text member) comes from one
walk over its tar headers (ustar, GNU long names and pax headers, each checksummed), or from
the manifest ``zephon index`` writes; documents are then read as byte ranges through
``byte_access`` (no tar parser per read). A ``.tar.gz``/``.tgz`` shard is decompressed once
per node into the shard cache and indexed and read there.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from zephon_core.errors import DataError
from zephon_core.sources import index_cache
from zephon_core.sources.base import Source, default_name, open_fs
from zephon_core.sources.byte_access import ByteReader, compression_of, file_sample, open_bytes
from zephon_core.sources.files import DEFAULT_ACCESS, Access, FileStat
from zephon_core.sources.manifest import ShardMeta
from zephon_core.sources.registry import SourceArgs, register_format
from zephon_core.sources.sharded import ShardedSource

SUFFIXES = (".tar", ".tar.gz", ".tgz")
DEFAULT_MEMBER = "txt"  # what the default text_field ("text") names: WebDataset's text member
_BLOCK = 512
_ZERO = bytes(_BLOCK)
_WINDOW = 1 << 20  # the walk reads a tar this much at a time, jumping over members larger than that
_REGULAR = (b"0", b"\0", b"7")
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # WebDataset's base_plus_ext: (key, extension)
_META = re.compile(r"__[^/]*__($|/)")  # WebDataset's skip_meta: members that are no sample's


def member_of(text_field: str) -> str:
    """The extension of the member a document is: ``text_field`` lowercased, without a leading dot.

    The default field ``"text"`` names WebDataset's ``.txt`` member; ``".text"`` names a ``.text`` member.
    """
    return DEFAULT_MEMBER if text_field == "text" else text_field.lstrip(".").lower()


def _compression(path: str) -> str | None:
    return "gzip" if path.endswith(".tgz") else compression_of(path)


def _number(field: bytes) -> int:
    """A header number: octal text, or base-256 (GNU, for values too large for octal)."""
    if field[:1] in (b"\x80", b"\xff"):
        n = int.from_bytes(field[1:], "big")
        return n - 256 ** (len(field) - 1) if field[:1] == b"\xff" else n
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


class _Window:
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


class _TarWalk:
    """The samples of one tar, checked member by member; every failure names the shard and where."""

    def __init__(self, window: _Window, url: str, member: str) -> None:
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


class WebDatasetFile(Source):
    """The samples of one WebDataset tar shard (``.tar``, ``.tar.gz``, ``.tgz``; local or on an object store).

    A document is the text of the sample's member with extension ``member_of(text_field)``.
    The index is built by one walk over the tar (every header checked, every text member
    decoded, so bad input fails when the shard is indexed), or taken from a manifest, and
    cached under ``access.cache_dir`` like JSONL's.
    """

    def __init__(self, path: str, text_field: str = "text", *, name: str | None = None,
                 storage_options: dict[str, Any] | None = None, access: Access = DEFAULT_ACCESS,
                 known: ShardMeta | None = None, index: dict[str, np.ndarray] | None = None,
                 stat: FileStat | None = None, allow_empty: bool = False) -> None:
        self.path = str(path)
        self.member = member_of(text_field)
        self.name = name or default_name(self.path)
        self._fs, self._fspath = open_fs(self.path, storage_options)
        sample, whole = file_sample(self._fs, self._fspath, stat, access, known)
        self._fingerprint: dict[str, Any] = {"kind": WebDatasetSource.kind, "member": self.member, **sample}
        self._bytes = open_bytes(self._fs, self._fspath, int(sample["size"]), str(sample["sample_blake2b"]), access,
                                 stat, _compression(self._fspath))
        arrays = self._index(access, index, stat, whole)
        self._starts, self._lengths = arrays["starts"], arrays["lengths"]
        if not allow_empty:
            self._require_nonempty(self.path)

    def _index(self, access: Access, given: dict[str, np.ndarray] | None, stat: FileStat | None,
               whole: bytes | None) -> dict[str, np.ndarray]:
        if given is not None and self._plausible(given):
            return given
        # Keyed on the listing's version too: the content sample covers only a file's ends.
        version = (stat.etag or stat.mtime) if stat is not None else None
        url = self._fs.unstrip_protocol(self._fspath)
        cache_file = index_cache.cache_path(index_cache.cache_root(access.cache_dir), url, f"webdataset:{self.member}")
        key = {**self._fingerprint, "version": str(version)}
        cached = index_cache.load(cache_file, key) if version is not None else None
        if cached is not None and self._plausible(cached):
            return cached
        spans = [(data, size) for _, data, size in self._walk(whole).samples()]
        arrays = {"starts": np.array([s for s, _ in spans], dtype=np.int64),
                  "lengths": np.array([n for _, n in spans], dtype=np.int64)}
        if version is not None:
            index_cache.store(cache_file, key, arrays)
        return arrays

    def _walk(self, whole: bytes | None = None) -> _TarWalk:
        return _TarWalk(_Window(self._bytes, whole), self.path, self.member)

    def _plausible(self, arrays: dict[str, np.ndarray]) -> bool:
        """An index must describe this tar: block-aligned, ordered, each member after its header, in bounds."""
        starts, lengths = arrays.get("starts"), arrays.get("lengths")
        if starts is None or lengths is None or len(starts) != len(lengths):
            return False
        if starts.dtype != np.int64 or lengths.dtype != np.int64:
            return False
        if len(starts) == 0:
            return True
        ends = starts + lengths
        return bool(starts[0] >= _BLOCK and np.all(starts % _BLOCK == 0) and np.all(lengths >= 0)
                    and np.all(starts[1:] >= ends[:-1] + _BLOCK) and ends[-1] <= self._bytes.size)

    @property
    def index_arrays(self) -> dict[str, np.ndarray]:
        """Each sample's text member as (byte offset, length): what a manifest stores next to the shard."""
        return {"starts": self._starts, "lengths": self._lengths}

    def __len__(self) -> int:
        return len(self._starts)

    def byte_lengths(self) -> np.ndarray:
        """Bytes of every sample's text member."""
        return self._lengths

    def read(self, indices: Sequence[int]) -> list[Any]:
        raws = self._bytes.read_many([(int(self._starts[i]), int(self._lengths[i])) for i in indices])
        out = []
        for i, raw in zip(indices, raws):
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError:  # the walk checked every member it indexed: this index came from elsewhere
                decode(raw, self.path, self._key_of(int(i)), self.member)
                raise
        return out

    def _key_of(self, n: int) -> str:
        """Sample ``n``'s key, for a message (a walk over the shard; it raises first where the shard is damaged)."""
        for k, (key, _, _) in enumerate(self._walk().samples()):
            if k == n:
                return key
        return f"number {n}"

    def fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)


@register_format
class WebDatasetSource(ShardedSource):
    """WebDataset tar shards from one file, a glob (``"s3://bucket/shards/*.tar"``), a folder (its ``.tar``,
    ``.tar.gz`` and ``.tgz`` files, recursively) or a list of them; shards in sorted order, samples in
    tar order. A document is a sample's ``member_of(text_field)`` member, as text.

    For many shards the folder's manifest (``zephon index``) is used when present: start-up opens
    no shard. See docs/formats.md.
    """

    format_name = "webdataset"
    kind = "webdataset"
    suffixes = SUFFIXES
    pretokenized = False
    index_keys = ("starts", "lengths")

    def __init__(self, path: str | Sequence[str], text_field: str = "text", *, name: str | None = None,
                 storage_options: dict[str, Any] | None = None, access: Access | None = None) -> None:
        self.text_field = text_field
        self._init_files(path, name, storage_options, access or Access())

    @classmethod
    def from_args(cls, args: SourceArgs) -> WebDatasetSource:
        return cls(args.path, args.text_field, name=args.name, storage_options=args.storage_options, access=args.access)

    @classmethod
    def check_args(cls, args: SourceArgs) -> tuple[str, str] | None:
        if not member_of(args.text_field):
            return "text_field", "names no member: give the text member's extension, e.g. \"txt\""
        if args.offsets is not None:
            return "offsets", "a webdataset source takes no offsets (its tar index is built or read from the manifest)"
        return None

    def manifest_options(self) -> dict[str, Any]:
        return {"member": member_of(self.text_field)}

    def open_file(self, url: str, meta: ShardMeta | None, single: bool, stat: FileStat | None = None) -> WebDatasetFile:
        return WebDatasetFile(url, self.text_field, storage_options=self.storage_options, access=self.access,
                              known=meta, index=self.stored_index(meta), stat=stat, allow_empty=not single)

    def index_arrays(self, f: int) -> dict[str, np.ndarray]:
        """Shard ``f``'s index of text members, for the manifest."""
        opened = self.file(f)
        assert isinstance(opened, WebDatasetFile)
        return opened.index_arrays
