"""One MosaicML Streaming MDS shard: its samples' bytes, and one column of them as text or tokens.

A shard (``streaming.MDSWriter``) is ``uint32`` sample count ``n``, ``uint32`` offsets ``[n + 1]``
(byte positions in the file), the writer's JSON config, then the samples: each is a ``uint32`` size
for every variable-size column, in column order, then every column's bytes, in column order.
A column is decoded here only as text (encoding ``str``: UTF-8) or as a 1-D integer token array
(encodings ``ndarray``, ``ndarray:DTYPE`` and ``ndarray:DTYPE:N``); the format's ``ndarray``
header is a dtype code byte (plain ``ndarray``), then, when the shape is not in the encoding, a
byte ``ndim << 2 | w`` and the shape in ``2**w``-byte unsigned integers. A shard is an
``indexed_file.StoredFile``, read through ``byte_access.open_bytes`` (a compressed one is decompressed
once per node into the shard cache), its header once, when it is first used; every problem is a one-line
``DataError`` naming the file, the shard, and the sample where there is one.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_core.errors import DataError
from zephon_core.io.byte_access import ByteReader, open_bytes
from zephon_core.io.files import Access, FileStat
from zephon_core.io.fs import is_local, shown
from zephon_core.sources.indexed_file import StoredFile
from zephon_core.sources.manifest import ShardMeta

#: ``ndarray`` value dtype codes (streaming's MDS format) that are integers: the ones a token document may have.
INT_CODES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 32: "uint32", 33: "int32", 64: "uint64", 65: "int64"}
_FAST_HASHES = ("xxh3_64", "xxh64", "xxh128", "xxh32", "blake2b", "sha1", "md5", "sha256")  # cheapest first


@dataclass(frozen=True)
class Column:
    """The column a source reads, as one shard's ``index.json`` entry lays it out."""

    name: str
    encoding: str
    position: int  # among the shard's columns
    sizes: tuple[int | None, ...]  # every column's fixed size in bytes (None: variable, its size leads the sample)
    dtype: str | None  # tokens: the values' dtype when the encoding fixes it
    shape: bool  # tokens: the shape is stored in each sample (the encoding gives no shape)
    text: bool


@dataclass(frozen=True)
class ShardSpec:
    """One shard as ``index.json`` describes it: enough to open it, check it and name it."""

    number: int  # its place in its index.json
    index_url: str
    raw_path: str  # inside the file system: the uncompressed shard
    raw_bytes: int
    raw_hashes: dict[str, str]
    zip_path: str | None  # the compressed shard, when the dataset was written with compression
    zip_bytes: int | None
    compression: str | None  # byte_access's name of it ("zstd", "gzip", ...)
    samples: int
    column: Column
    digest: str  # of its index.json entry: its fingerprint sample


class RawCheck:
    """A ``byte_access.Verifier``: a decompressed (or copied) shard's size and, when recorded, one of its hashes."""

    def __init__(self, spec: ShardSpec, where: str) -> None:
        self._spec, self._where, self._size = spec, where, 0
        self._algo, self._hash = _hasher(spec.raw_hashes)

    def update(self, data: bytes) -> None:
        self._size += len(data)
        if self._hash is not None:
            self._hash.update(data)

    def finish(self) -> None:
        spec = self._spec
        if self._size != spec.raw_bytes:
            raise DataError(f"{self._where}: decompresses to {self._size} bytes, index.json says {spec.raw_bytes}: "
                            "the shard is not the one index.json lists; rewrite it (streaming.MDSWriter)")
        if self._hash is not None and self._hash.hexdigest() != spec.raw_hashes[self._algo]:
            raise DataError(f"{self._where}: its {self._algo} hash {self._hash.hexdigest()} is not index.json's "
                            f"{spec.raw_hashes[self._algo]}: the shard is corrupt; rewrite it (streaming.MDSWriter)")


def _hasher(recorded: dict[str, str]) -> tuple[str, Any]:
    """The cheapest of the recorded hash algorithms this process has (xxhash's or hashlib's), new; (``""``, None): none."""
    for algo in sorted(recorded, key=lambda a: _FAST_HASHES.index(a) if a in _FAST_HASHES else len(_FAST_HASHES)):
        if algo.startswith("xxh"):
            try:
                import xxhash

                return algo, getattr(xxhash, algo)()
            except (ImportError, AttributeError):
                continue
        if algo in hashlib.algorithms_available:
            return algo, hashlib.new(algo)
    return "", None


def shard_where(url: str, spec: ShardSpec) -> str:
    """How a message names a shard: the file read, its number and its ``index.json``."""
    return f"{url} (shard {spec.number} of {spec.index_url})"


class MdsShard(StoredFile):
    """The documents of one MDS shard: its ``column``'s text or tokens, sample by sample.

    ``path`` is the file ``index.json`` lists (the compressed one where there is one). ``index.json`` is
    the shard's manifest: it gives the fingerprint sample (its entry's digest, the uncompressed size) and
    the sample count, and the shard's own header its offsets, so a shard has no index to scan or cache.
    """

    kind = "mds_shard"

    def __init__(self, spec: ShardSpec, path: str, **where: Any) -> None:
        self.spec = spec
        self.where = shard_where(shown(str(path)), spec)
        super().__init__(path, **where)

    def options(self) -> dict[str, Any]:
        return {"column": self.spec.column.name}

    def _sample(self, access: Access, stat: FileStat | None,
                known: ShardMeta | None) -> tuple[dict[str, Any], bytes | None]:
        return {"size": self.spec.raw_bytes, "sample_blake2b": self.spec.digest}, None

    def _open_bytes(self, access: Access, stat: FileStat | None, sample: dict[str, Any]) -> ByteReader:
        """The shard's uncompressed bytes: the raw file, or the compressed one decompressed into the shard cache,
        checked against ``index.json`` (``RawCheck``) as it is made."""
        fs, spec, listed = self._fs, self.spec, self.where
        local = is_local(fs)
        raw_beside = local and os.path.isfile(spec.raw_path) and os.path.getsize(spec.raw_path) == spec.raw_bytes
        if spec.zip_path is None or raw_beside:
            # Plain, or a folder Streaming itself decompressed into (it keeps the raw shard beside the zip).
            self.where = shard_where(shown(str(fs.unstrip_protocol(spec.raw_path))), spec)
            check = None if local else (lambda: RawCheck(spec, listed))
            return open_bytes(fs, spec.raw_path, spec.raw_bytes, spec.digest, access, verify=check)
        assert spec.zip_bytes is not None
        try:
            return open_bytes(fs, spec.zip_path, spec.zip_bytes, spec.digest, access, compression=spec.compression,
                              verify=lambda: RawCheck(spec, listed))
        except DataError as e:  # the byte layer names the file by its URL; name the shard too
            msg = str(e)
            if not msg.startswith(listed):
                msg = f"{listed}: {msg.removeprefix(str(fs.unstrip_protocol(spec.zip_path)) + ': ')}"
            raise DataError(msg) from None

    def _open(self, access: Access, index: dict[str, np.ndarray] | None, stat: FileStat | None,
              whole: bytes | None) -> None:
        """The shard's header: its sample count (checked against ``index.json``) and offsets."""
        reader, n = self._bytes, self.spec.samples
        head_end = 4 * (n + 2)
        if reader.size < head_end:
            raise DataError(f"{self.where}: {reader.size} bytes, too short for the header of its {n} samples: truncated")
        (head,) = reader.read_many([(0, head_end)])
        count = int(np.frombuffer(head, "<u4", 1)[0])
        if count != n:
            raise DataError(f"{self.where}: holds {count} samples, index.json says {n}: not the shard index.json lists")
        self._offsets = np.frombuffer(head, "<u4", n + 1, 4).astype(np.int64)
        self._check_offsets(head_end)

    def _check_offsets(self, head_end: int) -> None:
        off, size, spec = self._offsets, self._bytes.size, self.spec
        sized = f"{size} bytes" + (f", index.json says {spec.raw_bytes}" if size != spec.raw_bytes else "")
        if off[0] < head_end:
            raise DataError(f"{self.where}: sample 0: its offset {int(off[0])} points into the shard's header (bytes 0-{head_end - 1})")
        past = np.flatnonzero(off[1:] > size)
        if len(past):
            i = int(past[0])
            raise DataError(f"{self.where}: sample {i}: its offsets {int(off[i])}-{int(off[i + 1])} lie past the end of the shard "
                            f"({sized}): truncated or corrupt; rewrite it (streaming.MDSWriter)")
        back = np.flatnonzero(np.diff(off) < 0)
        if len(back):
            i = int(back[0])
            raise DataError(f"{self.where}: sample {i}: its offsets run backwards ({int(off[i])} > {int(off[i + 1])}): the shard is corrupt")
        if size != spec.raw_bytes or off[-1] != size:
            raise DataError(f"{self.where}: {sized}, its offsets end at byte {int(off[-1])}: not the shard index.json lists; "
                            "rewrite it (streaming.MDSWriter)")

    def __len__(self) -> int:
        return self.spec.samples

    def byte_lengths(self) -> np.ndarray:
        """Bytes of every sample (all its columns, as stored)."""
        return np.diff(self._offsets)

    def token_lengths(self) -> np.ndarray | None:
        """Every sample's token count from its offsets alone, where the layout tells it: a fixed-shape column, or the
        only variable-size column with its dtype in the encoding (its shape header's width follows from the count,
        as ``MDSWriter`` picks the narrowest). None for other layouts (counting would read every sample)."""
        col = self.spec.column
        if col.text or col.dtype is None:
            return None
        item = np.dtype(col.dtype).itemsize
        size = col.sizes[col.position]
        if size is not None:
            return np.full(len(self), size // item, dtype=np.int64)
        if [k for k, s in enumerate(col.sizes) if s is None] != [col.position]:
            return None
        rest = np.diff(self._offsets) - 4 - sum(s for s in col.sizes if s is not None) - 1  # the size, fixed columns, ndim byte
        counts = np.full(len(self), -1, dtype=np.int64)
        for w, low, high in ((1, 1, 1 << 8), (2, 1 << 8, 1 << 16), (4, 1 << 16, 1 << 32), (8, 1 << 32, 1 << 62)):
            n = (rest - w) // item
            fits = ((rest - w) % item == 0) & (n >= low) & (n < high)
            counts[fits] = n[fits]
        bad = counts < 0
        if bad.any():
            raise DataError(f"{self.where}: sample {int(np.argmax(bad))}: its length fits no array of {col.dtype}: the shard is corrupt")
        return counts

    def read(self, indices: Sequence[int]) -> list[Any]:
        idx = np.asarray(indices, dtype=np.int64)
        if self.spec.column.text:
            buf, start, length = self._column(idx)
            return [self._text(buf, s, n, int(i)) for s, n, i in zip(start.tolist(), length.tolist(), idx)]
        tokens, lengths = self.read_flat(idx)
        return np.split(tokens, np.cumsum(lengths)[:-1]) if len(lengths) else []

    def _text(self, buf: bytes, start: int, length: int, i: int) -> str:
        try:
            return buf[start : start + length].decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{self.where}: sample {i}: column {self.spec.column.name!r} is not valid UTF-8 (byte {e.start})") from None

    def _samples(self, idx: np.ndarray) -> tuple[bytes, np.ndarray, np.ndarray]:
        """The samples ``idx`` in one buffer (runs of consecutive samples in one read each), their starts and lengths in it."""
        uniq, back = np.unique(idx, return_inverse=True)
        first = np.flatnonzero(np.diff(uniq, prepend=-2) != 1)  # where a run of consecutive samples begins
        run_of = np.cumsum(np.diff(uniq, prepend=-2) != 1) - 1
        lo, hi = self._offsets[uniq[first]], self._offsets[np.append(uniq[first[1:] - 1], uniq[-1]) + 1]
        base = np.cumsum(hi - lo) - (hi - lo)
        buf = b"".join(self._bytes.read_many(list(zip(lo.tolist(), (hi - lo).tolist()))))
        starts = base[run_of] + self._offsets[uniq] - lo[run_of]
        return buf, starts[back], (self._offsets[uniq + 1] - self._offsets[uniq])[back]

    def _column(self, idx: np.ndarray) -> tuple[bytes, np.ndarray, np.ndarray]:
        """The samples' buffer and, in it, where the source's column starts in each and its length."""
        buf, start, length = self._samples(idx)
        col = self.spec.column
        arr = np.frombuffer(buf, np.uint8)
        nvar = sum(size is None for size in col.sizes)
        self._require(idx, length < 4 * nvar, f"shorter than the sizes of its {nvar} variable-size columns")
        sizes, k = [], 0
        for size in col.sizes:
            if size is None:
                sizes.append(_uints(arr, start + 4 * k, 4))
                k += 1
            else:
                sizes.append(np.full(len(idx), size, dtype=np.int64))
        total = np.sum(sizes, axis=0) if sizes else np.zeros(len(idx), np.int64)
        self._require(idx, total != length - 4 * nvar, "its column sizes do not add up to its length: the shard is corrupt")
        before = np.sum(sizes[: col.position], axis=0) if col.position else 0
        return buf, start + 4 * nvar + before, sizes[col.position]

    def _require(self, idx: np.ndarray, bad: np.ndarray, what: str) -> None:
        if bad.any():
            raise DataError(f"{self.where}: sample {int(idx[int(np.argmax(bad))])}: {what}")

    def read_flat(self, indices: np.ndarray, headroom: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The token documents at ``indices`` end to end (int64, after ``headroom`` unused slots) and their lengths."""
        idx = np.asarray(indices, dtype=np.int64)
        out = np.empty(headroom, dtype=np.int64)
        if not len(idx):
            return out, np.zeros(0, dtype=np.int64)
        buf, start, length = self._column(idx)
        arr, col = np.frombuffer(buf, np.uint8), self.spec.column
        codes = np.full(len(idx), 0, dtype=np.int64)
        if col.dtype is None:  # the dtype code leads every value
            self._require(idx, length < 1, f"column {col.name!r} is empty")
            codes = arr[start].astype(np.int64)
            self._require(idx, ~np.isin(codes, list(INT_CODES)), f"column {col.name!r} holds no integer array (dtype code not an integer's)")
            start, length = start + 1, length - 1
        if col.shape:
            start, length = self._skip_shape(idx, arr, start, length, codes)
        dtypes = {int(c): np.dtype(INT_CODES[int(c)] if col.dtype is None else col.dtype) for c in np.unique(codes)}
        item = np.array([dtypes[int(c)].itemsize for c in codes.tolist()]) if len(dtypes) > 1 else next(iter(dtypes.values())).itemsize
        self._require(idx, length % item != 0, f"column {col.name!r}: its byte length is not a whole number of values")
        lengths = length // item
        raw = memoryview(buf)
        pieces = [raw[a : a + n] for a, n in zip(start.tolist(), length.tolist())]
        if len(dtypes) == 1:
            flat = np.frombuffer(b"".join(pieces), next(iter(dtypes.values())))
        else:  # rare: documents of several dtypes in one read
            flat = np.concatenate([np.frombuffer(p, dtypes[int(c)]).astype(np.int64) for p, c in zip(pieces, codes.tolist())])
        out = np.empty(headroom + int(lengths.sum()), dtype=np.int64)
        out[headroom:] = flat
        return out, lengths.astype(np.int64)

    def _skip_shape(self, idx: np.ndarray, arr: np.ndarray, start: np.ndarray, length: np.ndarray,
                    codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Past each value's stored shape (``ndim << 2 | w``, then ``ndim`` ``2**w``-byte integers), which must be 1-D."""
        name = self.spec.column.name
        self._require(idx, length < 2, f"column {name!r}: no room for the array's shape")
        head = arr[start].astype(np.int64)
        self._require(idx, head >> 2 != 1, f"column {name!r}: not a 1-D array (a token document is 1-D)")
        width = 1 << (head & 3)
        self._require(idx, length < 1 + width, f"column {name!r}: no room for the array's shape")
        count = np.zeros(len(idx), dtype=np.int64)
        for w in (1, 2, 4, 8):
            at = np.flatnonzero(width == w)
            if len(at):
                count[at] = _uints(arr, start[at] + 1, w)
        start, length = start + 1 + width, length - 1 - width
        if self.spec.column.dtype is not None:
            item: Any = np.dtype(self.spec.column.dtype).itemsize
        else:
            item = np.array([np.dtype(INT_CODES[int(c)]).itemsize for c in codes.tolist()])
        self._require(idx, count * item != length, f"column {name!r}: its stored shape does not match its byte length: the shard is corrupt")
        return start, length


def _uints(arr: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The little-endian unsigned ``width``-byte integers at byte positions ``at`` of ``arr``, as int64."""
    gathered = arr[np.asarray(at, dtype=np.int64)[:, None] + np.arange(width)]
    return np.ascontiguousarray(gathered).view(f"<u{width}").ravel().astype(np.int64)
