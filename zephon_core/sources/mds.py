"""MosaicML Streaming MDS datasets, read where they are: ``format = "mds"`` (text) and ``"mds_tokens"`` (tokens).

A dataset is a folder (local, ``s3://``, any fsspec URL) that ``streaming.MDSWriter`` wrote: its
``index.json`` lists every shard with its sample count, columns, sizes, compression and hashes.
That file is the dataset's manifest: start-up reads it and nothing else (one request on an object
store, for 10,000 shards as for one), and a shard is opened when it is first read. A source may
also be a folder of several datasets, each in a sub-folder with its own ``index.json`` (Streaming's
"streams"), or a list of datasets; datasets are taken in sorted order of their folders, and a
dataset's shards and samples in ``index.json``'s order (Streaming's order without shuffling).

Whether a source's documents are text or tokens is a recipe's decision before any data is read
(a recipe of token sources needs no tokenizer), so it is the format's, not the column's: ``mds``
reads a ``str`` column as text, ``mds_tokens`` a 1-D integer ``ndarray`` column as tokens, and
each refuses the other's columns naming the format to use. Pickled (``pkl``) columns are never
loaded. Compressed shards (``zip_data``: zstd, gzip, bzip2, brotli, snappy) are decompressed once
per node into the shard cache, their size and (the cheapest recorded) hash checked as they are.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from collections.abc import Sequence
from typing import Any, ClassVar

import fsspec
from fsspec.core import url_to_fs

from zephon_core.errors import DataError
from zephon_core.io.byte_access import whole_object
from zephon_core.io.files import Access, FileSet, FileStat
from zephon_core.io.fs import default_name, is_local, shown
from zephon_core.sources.manifest import ShardMeta
from zephon_core.sources.mds_shard import INT_CODES, Column, MdsShard, ShardSpec, shard_where
from zephon_core.sources.registry import SourceArgs, register_format
from zephon_core.sources.sharded import FlatShardedSource, ShardedSource

INDEX = "index.json"
#: Streaming's compression families (``"zstd:7"``: zstd at level 7) and byte_access's names of them.
COMPRESSIONS = {"zstd": "zstd", "gz": "gzip", "bz2": "bzip2", "br": "brotli", "snappy": "snappy"}


def _parse(url: str, raw: bytes) -> list[dict[str, Any]]:
    try:
        body = json.loads(raw)
        shards = body["shards"]
        if not isinstance(shards, list):
            raise TypeError(f"shards is a {type(shards).__name__}")
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{url}: not a Streaming index.json ({type(e).__name__}: {e}); write the dataset with streaming.MDSWriter") from None
    if body.get("version") != 2:
        raise DataError(f"{url}: index.json version {body.get('version')!r}; Zephon reads Streaming's version 2")
    return shards


def read_indexes(paths: Sequence[str], storage_options: dict[str, Any] | None,
                 access: Access) -> tuple[fsspec.AbstractFileSystem, list[tuple[str, str, list[dict[str, Any]]]]]:
    """Every dataset the paths name, as ``(folder, index URL, shard entries)``, in sorted order of the folders.

    A path is a dataset's folder or its ``index.json`` (one request each), or a folder whose
    sub-folders are datasets (a listing of it, then one request per sub-folder).
    """
    fs, _ = url_to_fs(paths[0], **(storage_options or {}))
    found: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    for p in paths:
        _, inner = url_to_fs(p, **(storage_options or {}))
        inner = inner.rstrip("/")
        named = posixpath.basename(inner) == INDEX
        folder = posixpath.dirname(inner) if named else inner
        try:
            found[folder] = _one(fs, posixpath.join(folder, INDEX), access)
            continue
        except FileNotFoundError:
            if named:
                raise DataError(f"{p}: no such file") from None
        for sub in _sub_folders(fs, folder, p):
            try:
                found[sub] = _one(fs, posixpath.join(sub, INDEX), access)
            except FileNotFoundError:
                raise DataError(f"{display(fs, sub)}: a sub-folder of the MDS streams {p} without an {INDEX} "
                                "(an unfinished dataset?); finish writing it or move it out") from None
    return fs, [(folder, *found[folder]) for folder in sorted(found)]


def display(fs: fsspec.AbstractFileSystem, fspath: str) -> str:
    """How messages name a file: a local one by its path, others by their URL."""
    return fspath if is_local(fs) else str(fs.unstrip_protocol(fspath))


def _one(fs: fsspec.AbstractFileSystem, fspath: str, access: Access) -> tuple[str, list[dict[str, Any]]]:
    url = display(fs, fspath)
    return url, _parse(url, whole_object(fs, fspath, access))


def _sub_folders(fs: fsspec.AbstractFileSystem, folder: str, p: str) -> list[str]:
    fs.invalidate_cache(folder)
    try:
        entries = fs.ls(folder, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        raise DataError(f"{p}: no such MDS dataset folder (no {INDEX})") from None
    subs = sorted(str(e["name"]).rstrip("/") for e in entries if e.get("type") == "directory")
    subs = [s for s in subs if not posixpath.basename(s).startswith(".")]
    if not subs:
        raise DataError(f"{p}: no {INDEX} in this folder nor in a sub-folder: not an MDS dataset; write one with streaming.MDSWriter")
    return subs


def _column(entry: dict[str, Any], field: str, text: bool, where: str) -> Column:
    """The column ``field`` of a shard entry, refused unless it is text (``text``) or 1-D integer tokens."""
    names, encodings, sizes = list(entry["column_names"]), list(entry["column_encodings"]), list(entry["column_sizes"])
    if not len(names) == len(encodings) == len(sizes):
        raise DataError(f"{where}: column_names, column_encodings and column_sizes differ in length")
    if field not in names:
        listed = ", ".join(f"{n} ({e})" for n, e in zip(names, encodings))
        raise DataError(f"{where}: no column {field!r} (columns: {listed}); set text_field to the column of the {'text' if text else 'tokens'}")
    pos = names.index(field)
    enc = str(encodings[pos])
    kind, _, rest = enc.partition(":")
    if kind == "pkl":
        raise DataError(f"{where}: column {field!r} is pickled (pkl): unpickling runs code, so Zephon never loads it; "
                        "write the column as str (text) or ndarray (tokens)")
    if text and kind == "ndarray":
        raise DataError(f'{where}: column {field!r} holds token arrays ({enc}); read it with format = "mds_tokens"')
    if not text and kind == "str":
        raise DataError(f'{where}: column {field!r} holds text (str); read it with format = "mds"')
    if text and kind != "str":
        raise DataError(f"{where}: column {field!r} is {enc}, not text (str)")
    if not text and kind != "ndarray":
        raise DataError(f"{where}: column {field!r} is {enc}, not a token array (ndarray)")
    dtype, _, shape = rest.partition(":")
    if dtype and dtype not in INT_CODES.values():
        raise DataError(f"{where}: column {field!r} is {enc}: {dtype} values are not token ids (an integer ndarray is)")
    if "," in shape:
        raise DataError(f"{where}: column {field!r} is {enc}: a {shape.count(',') + 1}-D array; a token document is 1-D")
    fixed = tuple(None if s is None else int(s) for s in sizes)
    return Column(field, enc, pos, fixed, dtype or None, not shape, text)


def _file(folder: str, info: dict[str, Any], where: str) -> tuple[str, int, dict[str, str]]:
    base = str(info["basename"])
    if base.startswith("/") or ".." in base.split("/"):
        raise DataError(f"{where}: basename {base!r} leaves the dataset's folder")
    return posixpath.join(folder, base), int(info["bytes"]), {str(k): str(v) for k, v in (info.get("hashes") or {}).items()}


def shard_spec(entry: dict[str, Any], number: int, folder: str, index_url: str, field: str, text: bool) -> ShardSpec:
    """Shard ``number`` of the ``index.json`` at ``index_url`` (``folder`` inside the file system), checked."""
    where = f"{index_url}: shard {number}"
    try:
        if entry.get("format") != "mds":
            raise DataError(f"{where}: a {entry.get('format')!r} shard; Zephon reads Streaming's MDS shards (streaming.MDSWriter)")
        raw_path, raw_bytes, raw_hashes = _file(folder, entry["raw_data"], where)
        zipped, algo = entry.get("zip_data"), entry.get("compression")
        if bool(zipped) != bool(algo):
            raise DataError(f"{where}: compression {algo!r} with zip_data {zipped!r}: index.json is inconsistent")
        zip_path, zip_bytes, _ = _file(folder, zipped, where) if zipped else (None, None, {})
        compression = COMPRESSIONS.get(str(algo).partition(":")[0]) if algo else None
        if algo and compression is None:
            raise DataError(f"{where}: compression {algo!r} is not one Streaming writes ({', '.join(COMPRESSIONS)})")
        column = _column(entry, field, text, where)
        samples = int(entry["samples"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise DataError(f"{where}: malformed shard entry ({type(e).__name__}: {e})") from None
    # The fingerprint sample: the entry as the dataset states it, without where its files are.
    named = {k: ({**v, "basename": posixpath.basename(str(v["basename"]))} if isinstance(v, dict) and "basename" in v else v)
             for k, v in entry.items()}
    digest = hashlib.blake2b(json.dumps(named, sort_keys=True).encode(), digest_size=16).hexdigest()
    return ShardSpec(number, index_url, raw_path, raw_bytes, raw_hashes, zip_path, zip_bytes, compression, samples, column, digest)


@register_format
class MdsSource(ShardedSource):
    """The text of a ``str`` column of MosaicML Streaming MDS datasets: a dataset folder (local or
    ``s3://...``) or its ``index.json``, a folder of datasets (streams) or a list of them.

    Start-up reads each ``index.json`` (one request per dataset) and no shard; ``index.json`` is
    the manifest, so ``zephon index`` writes none and the files are set by ``ShardedSource._init_declared``
    (not listed, as a ``TextShardedSource``'s are). The fingerprint is what ``index.json`` says of
    every shard (columns, sizes, sample count, compression, hashes) and the column read, never the path.
    """

    format_name = "mds"
    kind = "mds"
    suffixes: ClassVar[tuple[str, ...]] = (".mds", ".mds.zstd", ".mds.gz", ".mds.bz2", ".mds.br", ".mds.snappy")
    path_endings: ClassVar[tuple[str, ...]] = (INDEX,)
    pretokenized = False
    indexable = False
    text: ClassVar[bool] = True
    default_column: ClassVar[str] = "text"

    def __init__(self, path: str | Sequence[str], text_field: str | None = None, *, name: str | None = None,
                 storage_options: dict[str, Any] | None = None, attempts: int = 5, cache_dir: str | None = None,
                 cache_bytes: int | None = None, local_copy: bool = False, access: Access | None = None) -> None:
        self.column = text_field or self.default_column
        self.path, self.storage_options = path, storage_options
        self.access = access or Access(attempts, None if cache_dir is None else str(cache_dir), cache_bytes, local_copy)
        paths = [str(path)] if isinstance(path, (str, os.PathLike)) else [str(p) for p in path]
        if not paths:
            raise DataError("a source needs at least one path")
        fs, datasets = read_indexes(paths, storage_options, self.access)
        root = datasets[0][0] if len(datasets) == 1 else posixpath.commonpath([d[0] for d in datasets])
        specs = [shard_spec(e, k, folder, url, self.column, self.text) for folder, url, entries in datasets for k, e in enumerate(entries)]
        stats = [FileStat(s.zip_path, s.zip_bytes) if s.zip_path and s.zip_bytes is not None else FileStat(s.raw_path, s.raw_bytes) for s in specs]
        files = FileSet(fs, root, tuple(stats), expanded=True, listed=False)
        metas = [ShardMeta(files.name(st), st.size, s.samples, s.digest) for st, s in zip(stats, specs)]
        self._shards = {m.name: s for m, s in zip(metas, specs)}
        where = paths[0] if len(paths) == 1 else f"{len(datasets)} MDS datasets under {display(fs, root)}"
        self._init_declared(files, metas, name or default_name(str(fs.unstrip_protocol(root))), where,
                            encoding=specs[0].column.encoding if specs else None)

    @classmethod
    def from_args(cls, args: SourceArgs) -> MdsSource:
        return cls(args.path, args.text_field, name=args.name, storage_options=args.storage_options, access=args.access)

    @classmethod
    def check_args(cls, args: SourceArgs) -> tuple[str, str] | None:
        if args.offsets:
            return "offsets", f"an {cls.format_name} source takes no offsets: index.json locates every sample"
        return None

    def manifest_options(self) -> dict[str, Any]:
        return {"column": self.column}

    def open_file(self, url: str, meta: ShardMeta | None, single: bool, stat: FileStat | None = None) -> MdsShard:
        assert meta is not None  # every shard has its entry from index.json
        spec = self._shards[meta.name]
        try:
            return MdsShard(spec, url, name=meta.name, storage_options=self.storage_options, access=self.access,
                            allow_empty=True)
        except FileNotFoundError:
            raise DataError(f"{shard_where(shown(url), spec)}: no such file, but index.json lists it; "
                            "copy the whole dataset folder") from None


@register_format
class MdsTokensSource(MdsSource, FlatShardedSource):
    """The token arrays of a 1-D integer ``ndarray`` column (``ndarray``, ``ndarray:int32``, ``ndarray:uint16:2048``...)
    of MosaicML Streaming MDS datasets, as ``MdsSource`` reads text: documents need no tokenizer."""

    format_name = "mds_tokens"
    kind = "mds_tokens"
    suffixes = ()
    path_endings = ()
    pretokenized = True
    text = False
    default_column = "tokens"
