"""WebDataset tar shards: one document per sample, its text the member the source names.

A sample is a run of consecutive tar members that share a key, as WebDataset groups them
(``webdataset.tariterators.base_plus_ext``): the key is a member's path up to the first dot
of its base name, the extension the rest, lowercased (``shard/000017.en.txt``: key
``shard/000017``, extension ``en.txt``). Directories, links, ``__meta__`` members and names
without an extension are not members of a sample, as in WebDataset.

A shard's index (the byte offset and length of each sample's text member) comes from one
walk over its tar headers (``tar_index``: ustar, GNU long names and pax headers, each checksummed), or from
the manifest ``zephon index`` writes; documents are then read as byte ranges through
``byte_access`` (no tar parser per read). A ``.tar.gz``/``.tgz`` shard is decompressed once
per node into the shard cache and indexed and read there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon_core.io.byte_access import compression_of
from zephon_core.io.files import Access
from zephon_core.sources.indexed_file import IndexedFile
from zephon_core.sources.registry import SourceArgs, register_format
from zephon_core.sources.sharded import TextShardedSource
from zephon_core.sources.tar_index import BLOCK, TarWalk, Window, decode

SUFFIXES = (".tar", ".tar.gz", ".tgz")
DEFAULT_MEMBER = "txt"  # what the default text_field ("text") names: WebDataset's text member


def member_of(text_field: str) -> str:
    """The extension of the member a document is: ``text_field`` lowercased, without a leading dot.

    The default field ``"text"`` names WebDataset's ``.txt`` member; ``".text"`` names a ``.text`` member.
    """
    return DEFAULT_MEMBER if text_field == "text" else text_field.lstrip(".").lower()


class WebDatasetFile(IndexedFile):
    """The samples of one WebDataset tar shard (``.tar``, ``.tar.gz``, ``.tgz``; local or on an object store).

    A document is the text of the sample's member with extension ``member_of(text_field)``.
    The index is built by one walk over the tar (every header checked, every text member
    decoded, so bad input fails when the shard is indexed), or taken from a manifest, and
    cached under ``access.cache_dir`` like JSONL's.
    """

    kind = "webdataset"

    def __init__(self, path: str, text_field: str = "text", **where: Any) -> None:
        self.member = member_of(text_field)
        super().__init__(path, **where)

    def options(self) -> dict[str, Any]:
        return {"member": self.member}

    def compression(self, fspath: str) -> str | None:
        return "gzip" if fspath.endswith(".tgz") else compression_of(fspath)

    def _build_index(self, whole: bytes | None = None) -> dict[str, np.ndarray]:
        spans = [(data, size) for _, data, size in self._walk(whole).samples()]
        return {"starts": np.array([s for s, _ in spans], dtype=np.int64),
                "lengths": np.array([n for _, n in spans], dtype=np.int64)}

    def _walk(self, whole: bytes | None = None) -> TarWalk:
        return TarWalk(Window(self._bytes, whole), self.path, self.member)

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
        return bool(starts[0] >= BLOCK and np.all(starts % BLOCK == 0) and np.all(lengths >= 0)
                    and np.all(starts[1:] >= ends[:-1] + BLOCK) and ends[-1] <= self._bytes.size)

    def read(self, indices: Sequence[int]) -> list[Any]:
        out = []
        for i, raw in zip(indices, self._spans(indices)):
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


@register_format
class WebDatasetSource(TextShardedSource):
    """WebDataset tar shards from one file, a glob (``"s3://bucket/shards/*.tar"``), a folder (its ``.tar``,
    ``.tar.gz`` and ``.tgz`` files, recursively) or a list of them; shards in sorted order, samples in
    tar order. A document is a sample's ``member_of(text_field)`` member, as text.

    For many shards the folder's manifest (``zephon index``) is used when present: start-up opens
    no shard. See docs/formats.md.
    """

    format_name = "webdataset"
    kind = "webdataset"
    suffixes = SUFFIXES
    index_keys = ("starts", "lengths")
    file_class = WebDatasetFile

    def __init__(self, path: str | Sequence[str], text_field: str = "text", *, name: str | None = None,
                 storage_options: dict[str, Any] | None = None, access: Access | None = None) -> None:
        self.text_field = text_field
        self._init_files(path, name, storage_options, access or Access())

    @classmethod
    def check_args(cls, args: SourceArgs) -> tuple[str, str] | None:
        if not member_of(args.text_field):
            return "text_field", "names no member: give the text member's extension, e.g. \"txt\""
        if args.offsets is not None:
            return "offsets", "a webdataset source takes no offsets (its tar index is built or read from the manifest)"
        return None

    def manifest_options(self) -> dict[str, Any]:
        return {"member": member_of(self.text_field)}
