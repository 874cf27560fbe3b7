"""A source made of many files: their documents end to end, in sorted file order.

Global document ``i`` is document ``i - starts[f]`` of file ``f``, found by a
binary search of the prefix sums of the files' document counts. Files are
opened on first use (from a manifest, start-up touches none of them), at most
``Access.max_open_files`` at once, and may be empty. The fingerprint covers the file set: every file's name, size and content
sample, grouped into at most ``BUCKETS`` digests, each naming its first and last
file, so an added, removed or changed shard is refused at restore naming where.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import numpy as np

from zephon_core.arrays import distinct, read_flat_grouped
from zephon_core.errors import DataError
from zephon_core.io.files import DEFAULT_ACCESS, Access, FileSet, FileStat, list_files
from zephon_core.io.fs import default_name
from zephon_core.sources import manifest
from zephon_core.sources.base import Source
from zephon_core.sources.manifest import ShardMeta
from zephon_core.sources.registry import FileSource, SourceArgs

BUCKETS = 64
SCAN_THREADS = 16
LAYOUT = "files/v1"  # the many-file part of a source's definition; bump when it changes


def file_set_fingerprint(metas: Sequence[ShardMeta]) -> dict[str, Any]:
    """The identity of a set of files, in at most ``BUCKETS`` named digests (paths left out: a corpus may move)."""
    per = max(1, -(-len(metas) // BUCKETS))
    buckets = []
    for a in range(0, len(metas), per):
        group = metas[a : a + per]
        h = hashlib.blake2b(digest_size=8)
        for m in group:
            h.update(f"{m.name}\x1f{m.size}\x1f{m.sample_blake2b}\x1f{m.documents}\n".encode())
        buckets.append([group[0].name, group[-1].name, h.hexdigest()])
    return {"layout": LAYOUT, "files": len(metas), "documents": sum(m.documents for m in metas), "buckets": buckets}


def scan_in_parallel(count: int, scan: Callable[[int], Any], progress: Callable[[int], None] | None = None) -> list[Any]:
    """``[scan(i) for i in range(count)]`` on up to ``SCAN_THREADS`` threads (I/O-bound on object stores), in order."""
    if count <= 1:
        out = [scan(i) for i in range(count)]
        if progress and count:
            progress(1)
        return out
    with ThreadPoolExecutor(min(SCAN_THREADS, count), thread_name_prefix="zephon-scan") as pool:
        futures = [pool.submit(scan, i) for i in range(count)]
        results = []
        for f in futures:
            results.append(f.result())
            if progress:
                progress(len(results))
    return results


class ShardedSource(FileSource):
    """Documents of one or many files end to end, in sorted file order; ``zephon index`` writes their manifest.

    A format subclass sets what a ``FileSource`` declares and defines ``open_file(url, meta, single)``
    (one file as a single-file source, ``meta`` from a manifest when there is one),
    ``manifest_options()`` (its settings that a manifest must have been built with)
    and ``index_arrays(f)`` where a manifest stores a file's document offsets.
    """

    #: ``zephon index`` writes this format's manifests (False: the data carries its own, as MDS's index.json).
    indexable: ClassVar[bool] = True
    #: The arrays of a file's index that a manifest stores beside it (``index_arrays``), if the format has one.
    index_keys: ClassVar[tuple[str, ...]] = ()

    def open_file(self, url: str, meta: ShardMeta | None, single: bool, stat: FileStat | None = None) -> Source:
        raise NotImplementedError

    def manifest_options(self) -> dict[str, Any]:
        return {}

    def index_arrays(self, f: int) -> dict[str, np.ndarray] | None:
        """File ``f``'s index arrays that the manifest keeps next to it (None: the format needs none)."""
        return None

    @classmethod
    def file_specs(cls, path: str | Sequence[str], storage_options: dict[str, Any] | None = None) -> str | Sequence[str]:
        """The paths, globs or folders of files that ``path`` names (a format may name files by a prefix)."""
        return path

    def stored_index(self, meta: ShardMeta | None) -> dict[str, np.ndarray] | None:
        """A file's index arrays that the manifest keeps (None without a manifest, with it disabled, or without
        ``index_keys``)."""
        if meta is None or not self.access.manifest or not self.index_keys:
            return None
        return manifest.read_index(self.files, meta.name, self.index_keys)

    def meta_of(self, st: FileStat, opened: Source) -> ShardMeta:
        """A file's manifest entry, from the opened file."""
        fp = opened.fingerprint()
        return ShardMeta(self.files.name(st), st.size, len(opened), str(fp["sample_blake2b"]), st.etag, st.mtime)

    def _init_files(self, path: str | Sequence[str], name: str | None, storage_options: dict[str, Any] | None, access: Access) -> None:
        self.path, self.access, self.storage_options = path, access, storage_options
        unlisted = None
        if access.manifest and not access.verify_listing:
            unlisted = manifest.read_unlisted(path, self.suffixes, storage_options, self.kind, self.manifest_options())
        self.files = files = unlisted[0] if unlisted else list_files(path, self.suffixes, storage_options)
        where = str(path) if isinstance(path, str) else f"{len(files.files)} files under {files.root}"
        opened: list[Source | None] = [None] * len(files.files)
        if not files.expanded:
            opened[0] = only = self.open_file(files.url(files.files[0]), None, True, files.files[0])
            self.metas = [self.meta_of(files.files[0], only)]
            self._fingerprint = only.fingerprint()  # a single file keeps the single-file fingerprint
            self.name = name or only.name
        else:
            metas: list[ShardMeta] | None = unlisted[1] if unlisted else None
            if metas is None and access.manifest:
                metas = manifest.read_manifest(files, self.kind, self.manifest_options())
            if metas is None:
                def scan(f: int) -> tuple[ShardMeta, Source | None]:
                    st = files.files[f]
                    one = self.open_file(files.url(st), None, False, st)
                    return self.meta_of(st, one), (one if f < access.max_open_files else None)  # the rest closes now

                total = len(files.files)
                report = (lambda done: access.progress(done, total)) if access.progress else None  # type: ignore[misc]
                scanned = scan_in_parallel(total, scan, report)
                metas, opened = [m for m, _ in scanned], [s for _, s in scanned]
            self.metas = metas
            self._fingerprint = self._file_set_fingerprint()
            self.name = name or default_name(files.root or where)
        self._init_shards(where, opened)

    def _init_declared(self, files: FileSet, metas: list[ShardMeta], name: str, where: str, **stated: Any) -> None:
        """What ``_init_files`` sets, for a format whose data lists its own files with their document counts
        (MDS's ``index.json``): no listing, no Zephon manifest and no file opened at start-up, and the
        fingerprint by the many-file rule, with what the data states of itself (``stated``: MDS's column
        encoding) after the format's settings."""
        self.files, self.metas, self.name = files, metas, name
        self._fingerprint = self._file_set_fingerprint(**stated)
        self._init_shards(where)

    def _file_set_fingerprint(self, **stated: Any) -> dict[str, Any]:
        """A many-file source's fingerprint: its kind, its settings, ``stated`` and its files' digests."""
        return {"kind": self.kind, **self.manifest_options(), **stated, **file_set_fingerprint(self.metas)}

    def _init_shards(self, where: str, opened: list[Source | None] | None = None) -> None:
        """What reading needs once ``files``, ``metas``, the fingerprint and the name are set: the files
        opened so far (default: none) and the documents' prefix sums. No documents at all is a ``DataError``."""
        self._keep_open = max(1, getattr(self, "access", DEFAULT_ACCESS).max_open_files)
        self._open: OrderedDict[int, Source] = OrderedDict((f, s) for f, s in enumerate(opened or []) if s is not None)
        self._lock = threading.Lock()
        self._starts = np.zeros(len(self.metas) + 1, dtype=np.int64)
        np.cumsum([m.documents for m in self.metas], out=self._starts[1:])
        if self._starts[-1] == 0:
            raise DataError(f"{where}: source has no documents (in {len(self.metas)} file(s)); "
                            "point it at files that hold some", recipe_key="path")

    def fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def file(self, f: int) -> Source:
        """File ``f`` as a single-file source: opened on first use and kept among the ``max_open_files``
        most recently read. A file dropped from them closes once no reader holds it, and opens again when read."""
        with self._lock:
            opened = self._open.get(f)
            if opened is not None:
                self._open.move_to_end(f)
                return opened
        # Opened outside the lock: on a store an open is a request, and reader threads reading files already
        # open must not wait behind it. Two threads opening one file at once keep the first (the same bytes).
        opened = self.open_file(self.files.url(self.files.files[f]), self.metas[f], False, self.files.files[f])
        if len(opened) != self.metas[f].documents:
            raise DataError(f"{self.metas[f].name}: {len(opened)} documents, but the source's index says "
                            f"{self.metas[f].documents}; rebuild the manifest (zephon index)")
        with self._lock:
            opened = self._open.setdefault(f, opened)
            self._open.move_to_end(f)
            if len(self._open) > self._keep_open:
                self._open.popitem(last=False)
        return opened

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """File number and document within it of each global document index."""
        f = np.searchsorted(self._starts, indices, side="right") - 1
        return f, indices - self._starts[f]

    def read(self, indices: Sequence[int]) -> list[Any]:
        idx = np.asarray(indices, dtype=np.int64)
        files, local = self.locate(idx)
        out: list[Any] = [None] * len(idx)
        for f in distinct(files):
            where = np.flatnonzero(files == f)
            for j, doc in zip(where, self.file(int(f)).read(local[where].tolist())):
                out[int(j)] = doc
        return out

    def _per_document(self, what: str) -> np.ndarray | None:
        """Every file's ``token_lengths`` or ``byte_lengths`` end to end (None unless every file knows them).

        Opens every file (in parallel): only token-weighted curricula ask.
        """
        parts = scan_in_parallel(len(self.metas), lambda f: getattr(self.file(f), what)())
        if any(p is None for p in parts):
            return None
        return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])

    def token_lengths(self) -> np.ndarray | None:
        return self._per_document("token_lengths")

    def byte_lengths(self) -> np.ndarray | None:
        return self._per_document("byte_lengths")

    def describe(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self.metas)} file(s), {len(self)} documents)"


class FlatShardedSource(ShardedSource):
    """A many-file pretokenized source: ``read_flat`` gathers from each file's ``read_flat``."""

    def read_flat(self, indices: np.ndarray, headroom: int = 0) -> tuple[np.ndarray, np.ndarray]:
        files, local = self.locate(np.asarray(indices, dtype=np.int64))
        return read_flat_grouped(files, lambda f, where, room: self.file(f).read_flat(local[where], room), headroom)  # type: ignore[attr-defined]


class TextShardedSource(ShardedSource):
    """A many-file text format whose documents are one field of each record (``text_field``), each file opened
    as a ``file_class(url, text_field, ...)`` with its manifest entry and stored index: the recipe keys it
    takes, what its manifest records of its settings and of each file's index, shared by such formats."""

    text_field: str
    pretokenized = False
    #: One file of the format: ``file_class(url, text_field, storage_options=, access=, known=, index=, stat=,
    #: allow_empty=)``, with an ``index_arrays`` property where the format has ``index_keys``.
    file_class: ClassVar[Callable[..., Source]]

    @classmethod
    def from_args(cls, args: SourceArgs) -> Source:
        return cls(args.path, args.text_field, name=args.name, storage_options=args.storage_options, access=args.access)  # type: ignore[call-arg]

    def manifest_options(self) -> dict[str, Any]:
        return {"text_field": self.text_field}

    def open_file(self, url: str, meta: ShardMeta | None, single: bool, stat: FileStat | None = None) -> Source:
        return self.file_class(url, self.text_field, storage_options=self.storage_options, access=self.access,
                               known=meta, index=self.stored_index(meta), stat=stat, allow_empty=not single)

    def index_arrays(self, f: int) -> dict[str, np.ndarray] | None:
        """File ``f``'s index, for the manifest."""
        return getattr(self.file(f), "index_arrays", None) if self.index_keys else None
