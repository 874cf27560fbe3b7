"""``zephon index``: write the index manifest of a many-file source next to its files."""

from __future__ import annotations

import argparse
import json
from typing import Any

from zephon_core.cli.progress import Progress
from zephon_core.errors import CliError
from zephon_core.io.files import Access, list_files
from zephon_core.sources import manifest
from zephon_core.sources.registry import FileSource, SourceArgs, formats, guess_format, source_format
from zephon_core.sources.sharded import ShardedSource


def cmd_index(a: argparse.Namespace) -> int:
    """Write the index manifest of a many-file source next to its files (see docs/sources_at_scale.md)."""
    cls = _indexable(a.format, a.source[0])
    try:
        options = json.loads(a.storage_options) if a.storage_options else None
    except json.JSONDecodeError as e:
        raise CliError(f"--storage-options: not a JSON object ({e})") from None
    bar: list[Progress] = []

    def progress(done: int, total: int) -> None:
        if not bar:
            bar.append(Progress(total, a))
        while bar[0].done < done:
            bar[0].step("files indexed")

    paths = a.source if len(a.source) > 1 else a.source[0]
    if a.check:
        return _check(cls, paths, a, options)
    source = _source(cls, paths, a.text_field, options, Access(attempts=a.attempts, manifest=False, progress=progress))
    if not source.files.expanded:
        raise CliError(f"{a.source[0]}: a single file needs no manifest; index a folder, a glob or a list of files")
    indexes = {m.name: arrays for f, m in enumerate(source.metas) if (arrays := source.index_arrays(f)) is not None}
    url = manifest.write_manifest(source.files, source.kind, source.manifest_options(), source.metas, indexes)
    print(f"wrote {url}: {len(source.metas)} files, {len(source)} documents")
    return 0


def _indexable_formats() -> list[type[ShardedSource]]:
    """The registered formats that have manifests: those of many files."""
    return [c for c in formats() if issubclass(c, ShardedSource) and c.indexable]


def _indexable(name: str | None, path: str) -> type[ShardedSource]:
    """The format ``--format`` names, or else the one ``path``'s suffix says, if it has manifests."""
    cls: type[FileSource] = source_format(name, "--format") if name else guess_format(path, "pass --format")
    if not issubclass(cls, ShardedSource) or not cls.indexable:
        names = ", ".join(c.format_name for c in _indexable_formats())
        raise CliError(f"{path}: a {cls.format_name} source has no manifest; "
                       f"zephon index writes those of {names} sources")
    return cls


def _source(cls: type[ShardedSource], paths: str | list[str], text_field: str, options: dict[str, Any] | None,
            access: Access) -> ShardedSource:
    source = cls.from_args(SourceArgs(paths, text_field=text_field, storage_options=options, access=access))
    assert isinstance(source, ShardedSource)
    return source


def _check(cls: type[ShardedSource], paths: str | list[str], a: argparse.Namespace,
           options: dict[str, Any] | None) -> int:
    """List the source and compare the listing with its manifest (what a pipeline on S3 skips at start-up)."""
    files = list_files(cls.file_specs(paths, options), cls.suffixes, options)
    where = f"{files.root.rstrip('/')}/{manifest.MANIFEST}"
    if not files.expanded or not files.fs.exists(where):
        raise CliError(f"{files.fs.unstrip_protocol(where)}: no manifest to check; write one with `zephon index {a.source[0]}`")
    source = _source(cls, paths, a.text_field, options, Access(attempts=a.attempts, verify_listing=True))
    print(f"{a.source[0]}: the manifest matches the listing: {len(source.metas)} files, {len(source)} documents")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("index", help="write the index manifest of a many-file source (a folder, a glob or several paths)")
    p.add_argument("source", nargs="+", help="a folder, a glob (quote it) or files of one source")
    p.add_argument("--format", choices=[c.format_name for c in _indexable_formats()],
                   help="default: from the file names")
    p.add_argument("--text-field", default="text")
    p.add_argument("--storage-options", help='fsspec storage options as JSON, e.g. \'{"client_kwargs": {"endpoint_url": "..."}}\'')
    p.add_argument("--attempts", type=int, default=5, help="per object-store request before giving up")
    p.add_argument("--check", action="store_true", help="list the files and compare them with the manifest instead of writing one (exit 1 naming the "
                   "first file added, removed or changed)")
    p.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is not a terminal")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(fn=cmd_index)
