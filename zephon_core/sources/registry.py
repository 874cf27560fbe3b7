"""The source formats: the one list that recipes, ``zephon index`` and the CLI consult.

A format is a ``FileSource`` subclass that names itself (``format_name``, a recipe's
``format``) and the file suffixes it owns, and registers itself in its own module. A
text format indexed once and read by byte range is two short classes, one file and the
many-file source naming it as its ``file_class`` (docs/architecture.md, "Adding a source";
``jsonl.py``, ``webdataset.py``)::

    class CsvFile(IndexedFile):
        kind = "csv"
        ...  # options() (for the fingerprint), _build_index, _plausible, read

    @register_format
    class CsvSource(TextShardedSource):
        format_name = "csv"
        kind = "csv"             # the data definition's name for it: never changes
        suffixes = (".csv",)
        index_keys = ("starts", "lengths")  # the index arrays a manifest holds
        file_class = CsvFile

        def __init__(self, path, text_field="text", *, name=None, storage_options=None, access=None):
            self.text_field = text_field
            self._init_files(path, name, storage_options, access or Access())

``TextShardedSource`` gives ``from_args``, ``open_file`` and the manifest's parts; a
format of another shape (token arrays, a library's reader, its own manifest) starts from
``ShardedSource`` or ``FileSource`` as docs/architecture.md says, and the module is
imported in ``sources/__init__.py``, which registers it.

Recipes find it by name (``source_format``), ``zephon index`` by a path's suffix
(``guess_format``); an unknown name or suffix is a one-line error naming the field
or the file and listing the registered formats.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from fsspec.core import url_to_fs

from zephon_core.errors import ConfigError, DataError
from zephon_core.io.files import Access
from zephon_core.sources.base import Source

DEFAULT_FORMAT = "jsonl"  # a recipe source without ``format``, and a path without a suffix


@dataclass(frozen=True)
class SourceArgs:
    """One source as a recipe entry or the command line gives it: the same keys for every format."""

    path: str | Sequence[str]  # a file, a glob, a folder or a prefix, or a list of them
    name: str | None = None
    text_field: str = "text"  # text formats: the field or column holding the text
    offsets: str | None = None  # token_array: the .npy of document offsets
    storage_options: dict[str, Any] | None = None  # fsspec options of the files' store
    access: Access | None = None  # how files are read (None: the format's defaults)


class FileSource(Source):
    """A source of documents read from the files a path names: what a registered format declares."""

    #: A recipe's ``format`` (and ``zephon index --format``) for this class.
    format_name: ClassVar[str]
    #: The name its fingerprint (the data definition) and its manifests record: once released, never changed.
    kind: ClassVar[str]
    #: The endings of the file names it reads (a folder is listed for these): e.g. ``(".jsonl", ".jsonl.gz")``.
    suffixes: ClassVar[tuple[str, ...]]
    #: Documents are token arrays (recipes of these need no tokenizer), not text.
    pretokenized: ClassVar[bool]
    #: More endings of a path that name this format without being file names it lists (a prefix's).
    path_endings: ClassVar[tuple[str, ...]] = ()

    @classmethod
    @abstractmethod
    def from_args(cls, args: SourceArgs) -> Source:
        """The source that ``args`` describe (after ``check_args`` found nothing wrong)."""

    @classmethod
    def check_args(cls, args: SourceArgs) -> tuple[str, str] | None:
        """The first key of ``args`` this format cannot take and why, as ``(key, message)``; None: none.

        Recipes check it when they are loaded, before any file is read, and name the key.
        """
        return None

    @classmethod
    def explain_missing(cls, path: str) -> str | None:
        """Where ``path`` holds no data yet, a message more useful than opening it would give (None: open it)."""
        return None


_Format = TypeVar("_Format", bound=type[FileSource])
_FORMATS: dict[str, type[FileSource]] = {}


def register_format(cls: _Format) -> _Format:
    """Make ``cls`` a source format (a class decorator): recipes, ``zephon index`` and the CLI then find it.

    A name or a suffix that another registered format has is a ``ValueError``.
    """
    for other in _FORMATS.values():
        if other is cls:
            return cls
        if other.format_name == cls.format_name:
            raise ValueError(f"format {cls.format_name!r} is registered already ({other.__qualname__})")
        shared = set(other.suffixes + other.path_endings) & set(cls.suffixes + cls.path_endings)
        if shared:
            owned = ", ".join(sorted(shared))
            raise ValueError(f"format {cls.format_name!r}: {other.format_name!r} owns {owned} already")
    _FORMATS[cls.format_name] = cls
    return cls


def unregister_format(name: str) -> None:
    """Forget the format ``name`` (tests register formats of their own)."""
    _FORMATS.pop(name, None)


def formats() -> list[type[FileSource]]:
    """Every registered format, in the order they were registered."""
    return list(_FORMATS.values())


def source_format(name: str, where: str) -> type[FileSource]:
    """The format registered as ``name``; a ``ConfigError`` starting with ``where`` when there is none."""
    found = _FORMATS.get(name)
    if found is None:
        raise ConfigError(f"{where}: unknown format {name!r}; registered formats: {', '.join(_FORMATS)}")
    return found


def formats_in(path: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """The registered formats whose files the folder ``path`` holds (its top two levels), for a message
    to name when a recipe reads it as another format; empty when it holds none or cannot be listed."""
    try:
        fs, inner = url_to_fs(path, **(storage_options or {}))
        names = [str(n) for n in fs.find(inner, maxdepth=2)]
    except (OSError, ValueError):
        return []
    return [c.format_name for c in _FORMATS.values() if any(n.endswith(c.suffixes) for n in names if c.suffixes)]


def in_recipe(e: DataError, recipe: str, n: int, *, list_given: bool, fmt: str, folder: str | None) -> DataError:
    """``e`` naming the recipe and the key of its source ``n`` it is about (``paths`` when the source lists them),
    and the format ``folder`` holds where it holds none of the files the source's format ``fmt`` reads."""
    key = "paths" if e.recipe_key == "path" and list_given else e.recipe_key
    others = [f for f in formats_in(folder) if f != fmt] if e.recipe_key == "path" and folder is not None else []
    hint = f'; it holds {others[0]} files: set format = "{others[0]}" in sources[{n}]' if others else ""
    return DataError(f"{recipe}: sources[{n}]{'.' + key if key else ''}: {e}{hint}", recipe_key=e.recipe_key)


def guess_format(path: str, fix: str) -> type[FileSource]:
    """The format whose suffix (or path ending) ends ``path``; the longest such ending decides.

    A folder or a name without a suffix is the default format. A suffix no format owns
    is a ``ConfigError`` naming ``path``, listing every format's suffixes and ending
    with ``fix`` (how to name the format instead).
    """
    last = path.rstrip("/").rsplit("/", 1)[-1]
    owners = [(len(end), c) for c in _FORMATS.values() for end in c.suffixes + c.path_endings if last.endswith(end)]
    if owners:
        return max(owners, key=lambda owner: owner[0])[1]
    folder = path.endswith("/") or ("://" not in path and os.path.isdir(path))
    if "." in last and not folder:
        owned = "; ".join(f"{c.format_name}: {' '.join(c.suffixes + c.path_endings)}" for c in _FORMATS.values())
        raise ConfigError(f"{path}: no registered source format reads {last[last.index('.'):]} files ({owned}); {fix}")
    return source_format(DEFAULT_FORMAT, path)
