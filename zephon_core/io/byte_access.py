"""One file's bytes, wherever it lives: the reader every format opens its files through.

``open_bytes`` answers with a ``LocalBytes`` (pread on a local file) or a
``RemoteBytes`` (coalesced, verified, retried range reads of an object, served
from the process's page pool); a compressed file, or an object the access asks
to copy whole, is made once per node into the shard cache and read from there.
A format never opens a file another way, so every format gets the same retries,
version checks, caches and counters, and adding one needs no I/O code of its own.

Compression is named by a file's last suffix (``COMPRESSIONS``): a gzip, zstd,
bzip2, brotli or snappy stream cannot be entered in the middle, so it is decompressed
whole, once per node; one pass per shard per node costs less than any index of
restart points read by thousands of ranks. A format that knows what the whole content
must be (its size, a hash) checks each entry once, as it is made (``Verifier``).
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
from collections.abc import Callable
from typing import IO, Any, Protocol

import fsspec

from zephon_core.errors import DataError
from zephon_core.io.files import Access, FileStat
from zephon_core.io.fs import content_fingerprint, is_local, sample_digest, sample_spans
from zephon_core.io.remote import (
    LocalBytes,
    RemoteBytes,
    ScanStream,
    Version,
    fetch_object,
    fetch_range,
    fetch_whole,
)
from zephon_core.io.shard_cache import ShardCache

ByteReader = LocalBytes | RemoteBytes


class KnownSample(Protocol):
    """A file's fingerprint sample recorded before (a manifest entry): read instead of the file."""

    @property
    def size(self) -> int: ...

    @property
    def sample_blake2b(self) -> str: ...


_BLOCK = 1 << 22
SMALL_OBJECT_BYTES = 2 << 20  # a plain object this small is fetched whole at start-up, in one request


def _copy_decompressed(z: gzip.GzipFile | bz2.BZ2File, dst: IO[bytes]) -> None:
    while chunk := z.read(_BLOCK):
        dst.write(chunk)


def _gunzip(src: IO[bytes], dst: IO[bytes]) -> None:
    with gzip.GzipFile(fileobj=src) as z:
        _copy_decompressed(z, dst)


def _bunzip(src: IO[bytes], dst: IO[bytes]) -> None:
    with bz2.BZ2File(src) as z:
        _copy_decompressed(z, dst)


def _unzstd(src: IO[bytes], dst: IO[bytes]) -> None:
    try:
        import zstandard
    except ImportError:
        raise DataError("reading zstd-compressed files needs the zstandard package: pip install 'zephon-suite[zstd]'") from None
    zstandard.ZstdDecompressor().copy_stream(src, dst)


def _unbrotli(src: IO[bytes], dst: IO[bytes]) -> None:
    try:
        import brotli
    except ImportError:
        raise DataError("reading brotli-compressed files needs the brotli package: pip install brotli") from None
    dst.write(brotli.decompress(src.read()))  # brotli's Python binding has no stream reader of a file


def _unsnappy(src: IO[bytes], dst: IO[bytes]) -> None:
    try:
        import snappy  # type: ignore[import-untyped]
    except ImportError:
        raise DataError("reading snappy-compressed files needs the python-snappy package: pip install python-snappy") from None
    dst.write(snappy.decompress(src.read()))  # one raw snappy block (python-snappy's compress), not the framed format


#: A file suffix and the compression it names, with the function that decompresses such a stream.
COMPRESSIONS: dict[str, tuple[str, Callable[[IO[bytes], IO[bytes]], None]]] = {
    ".gz": ("gzip", _gunzip),
    ".zst": ("zstd", _unzstd),
    ".zstd": ("zstd", _unzstd),
    ".bz2": ("bzip2", _bunzip),
    ".br": ("brotli", _unbrotli),
    ".snappy": ("snappy", _unsnappy),
}


def compression_of(path: str) -> str | None:
    """The compression ``path``'s last suffix names (``"gzip"``, ``"zstd"``...), None for a plain file."""
    for suffix, (name, _) in COMPRESSIONS.items():
        if path.endswith(suffix):
            return name
    return None


def _decompressor(name: str) -> Callable[[IO[bytes], IO[bytes]], None]:
    return next(fn for kind, fn in COMPRESSIONS.values() if kind == name)


class Verifier(Protocol):
    """What a format checks of a file's whole content as the shard cache makes its entry: fed every byte."""

    def update(self, data: bytes) -> None: ...

    def finish(self) -> None:
        """A ``DataError`` when the content is not what the format expected (the entry is then not kept)."""


class _Fed(io.RawIOBase):
    """A binary file that also feeds what is written to it to a ``Verifier``."""

    def __init__(self, out: IO[bytes], verifier: Verifier) -> None:
        super().__init__()
        self._out, self._verifier = out, verifier

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._verifier.update(bytes(data))
        return self._out.write(data)


def whole_object(fs: fsspec.AbstractFileSystem, fspath: str, access: Access) -> bytes:
    """A small file whose size is not known yet (a dataset's own index), whole: on a store, one verified,
    retried request. ``FileNotFoundError`` when there is none."""
    return bytes(fs.cat_file(fspath)) if is_local(fs) else fetch_whole(fs, fspath, access.attempts)


def small_object(fs: fsspec.AbstractFileSystem, fspath: str, stat: FileStat | None, access: Access) -> bytes | None:
    """A small plain object on a store, whole, in one request; None where reading it in place is better.

    A format that indexes its files at start-up takes both the fingerprint's sample and the
    index from these bytes instead of sampling and scanning the object in several requests.
    """
    if stat is None or is_local(fs) or compression_of(fspath) or access.local_copy or stat.size > SMALL_OBJECT_BYTES:
        return None
    return fetch_range(fs, fspath, 0, stat.size, access.attempts, Version(stat.size, stat.etag) if stat.etag else None)


def file_sample(fs: fsspec.AbstractFileSystem, fspath: str, stat: FileStat | None, access: Access,
                known: KnownSample | None = None) -> tuple[dict[str, Any], bytes | None]:
    """A file's fingerprint sample (``size``, ``sample_blake2b``) and, for a small object on a store, its whole bytes.

    ``known`` (its manifest entry) answers without a request; a small object is fetched whole in one
    request (``small_object``), and the format indexes it from those bytes; otherwise its ends are sampled.
    """
    if known is not None:
        return {"size": known.size, "sample_blake2b": known.sample_blake2b}, None
    whole = small_object(fs, fspath, stat, access)
    if whole is not None:
        return {"size": len(whole), "sample_blake2b": sample_digest(whole)}, whole
    return content_fingerprint(fs, fspath), None


def reader_sample(reader: ByteReader) -> dict[str, Any]:
    """A file's size and content sample (``content_fingerprint``'s values) read through ``reader``: verified,
    retried reads that bypass the page pool, so a start-up over thousands of files evicts no page in use."""
    h = hashlib.blake2b(digest_size=16)
    for start, length in sample_spans(reader.size):
        h.update(reader.scan(start, length))
    return {"size": reader.size, "sample_blake2b": h.hexdigest()}


def open_bytes(fs: fsspec.AbstractFileSystem, fspath: str, size: int, sample_blake2b: str, access: Access,
               stat: FileStat | None = None, compression: str | None = None,
               verify: Callable[[], Verifier] | None = None) -> ByteReader:
    """The bytes of the file ``fspath`` of ``fs`` (``size`` bytes, as stored), decompressed where ``compression`` says.

    ``sample_blake2b`` (the file's fingerprint sample) keys its shard-cache entry, so an edited
    file never reads a stale copy; ``stat`` (from a listing or a manifest) lets every read on an
    object store check that it is served the version the source recorded. A stream that does
    not decompress is a ``DataError`` naming the file and the compression. ``verify`` makes a
    ``Verifier`` that checks an entry's whole (decompressed or copied) content once, as it is made.
    """
    if is_local(fs) and compression is None:
        return LocalBytes(fspath)
    if is_local(fs):
        stored: ByteReader = LocalBytes(fspath)
    else:
        stored = RemoteBytes(fs, fspath, size, attempts=access.attempts, etag=stat.etag if stat else None)
        if compression is None and not access.local_copy:
            return stored
    cache = ShardCache(None if access.cache_dir is None else f"{access.cache_dir}/shards", access.cache_bytes)
    url = fs.unstrip_protocol(fspath)
    key = f"{compression or 'copy'}\x1f{url}\x1f{sample_blake2b}\x1f{size}"

    def make(into: IO[bytes]) -> None:
        verifier = verify() if verify is not None else None
        out: Any = into if verifier is None else _Fed(into, verifier)
        _make(out)
        if verifier is not None:
            verifier.finish()

    def _make(out: IO[bytes]) -> None:
        if compression is None:
            fetch_object(stored, out)
            return
        try:
            # Through verified, retried reads: a store's own stream is neither.
            _decompressor(compression)(io.BufferedReader(ScanStream(stored)), out)
        except DataError:
            raise
        except FileNotFoundError:
            raise DataError(f"{url}: no such file") from None
        except Exception as e:  # gzip: OSError/EOFError, zstandard: ZstdError, brotli: brotli.error
            raise DataError(f"{url}: cannot decompress ({compression}): {type(e).__name__}: {e}") from None

    return LocalBytes(str(cache.get(key, make)))


class ByteFile(io.RawIOBase):
    """A read-only, seekable file object over a ``ByteReader``, for libraries that want one (pyarrow,
    tarfile): every read they make is one of the reader's verified, retried, page-pooled reads."""

    def __init__(self, reader: ByteReader, name: str) -> None:
        super().__init__()
        self._reader = reader
        self._pos = 0
        self.name = name
        self.size = reader.size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self.size - self._pos)
        if want <= 0:
            return 0
        (data,) = self._reader.read_many([(self._pos, want)])
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        want = self.size - self._pos if size is None or size < 0 else min(size, self.size - self._pos)
        if want <= 0:
            return b""
        (data,) = self._reader.read_many([(self._pos, want)])
        self._pos += len(data)
        return data
