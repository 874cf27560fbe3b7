"""``zephon index``: write the index manifest of a many-file source next to its files."""

from __future__ import annotations

import argparse
import json
from typing import Any

from zephon_core.tools.errors import CliError
from zephon_core.tools.progress import Progress


def cmd_index(a: argparse.Namespace) -> int:
    """Write the index manifest of a many-file source next to its files (see docs/sources_at_scale.md)."""
    from zephon_core import JsonlSource
    from zephon_core.sources import manifest
    from zephon_core.sources.files import Access

    fmt = a.format or ("parquet" if a.source[0].rstrip("/").endswith(".parquet") else
                       "megatron" if a.source[0].endswith((".idx", "_document")) else "jsonl")
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
        return _check(fmt, paths, a, options)
    access = Access(attempts=a.attempts, manifest=False, progress=progress)
    source = _source(fmt, paths, a.text_field, options, access)
    if not source.files.expanded:
        raise CliError(f"{a.source[0]}: a single file needs no manifest; index a folder, a glob or a list of files")
    indexes = {m.name: source.index_arrays(f) for f, m in enumerate(source.metas)} if isinstance(source, JsonlSource) else None
    url = manifest.write_manifest(source.files, source.kind, source.manifest_options(), source.metas, indexes)
    print(f"wrote {url}: {len(source.metas)} files, {len(source)} documents")
    return 0


def _source_class(fmt: str) -> Any:
    from zephon_core import JsonlSource, MegatronIndexedSource, ParquetSource

    return {"jsonl": JsonlSource, "parquet": ParquetSource, "megatron": MegatronIndexedSource}[fmt]


def _source(fmt: str, paths: Any, text_field: str, options: dict[str, Any] | None, access: Any) -> Any:
    cls = _source_class(fmt)
    if fmt == "megatron":
        return cls(paths, access=access)
    return cls(paths, text_field, storage_options=options, access=access)


def _check(fmt: str, paths: Any, a: argparse.Namespace, options: dict[str, Any] | None) -> int:
    """List the source and compare the listing with its manifest (what a pipeline on an object store skips at start-up)."""
    from zephon_core.sources.files import Access, list_files
    from zephon_core.sources.manifest import MANIFEST

    cls = _source_class(fmt)
    files = list_files(cls.file_specs(paths), cls.suffixes, options)
    where = f"{files.root.rstrip('/')}/{MANIFEST}"
    if not files.expanded or not files.fs.exists(where):
        raise CliError(f"{files.fs.unstrip_protocol(where)}: no manifest to check; write one with `zephon index {a.source[0]}`")
    source = _source(fmt, paths, a.text_field, options, Access(attempts=a.attempts, verify_listing=True))
    print(f"{a.source[0]}: the manifest matches the listing: {len(source.metas)} files, {len(source)} documents")
    return 0


def add_index_parser(sub: Any) -> None:
    p = sub.add_parser("index", help="write the index manifest of a many-file source (a folder, a glob or several paths)")
    p.add_argument("source", nargs="+", help="a folder, a glob (quote it) or files of one source")
    p.add_argument("--format", choices=["jsonl", "parquet", "megatron"], help="default: from the file names")
    p.add_argument("--text-field", default="text")
    p.add_argument("--storage-options", help='fsspec storage options as JSON, e.g. \'{"client_kwargs": {"endpoint_url": "..."}}\'')
    p.add_argument("--attempts", type=int, default=5, help="per object-store request before giving up")
    p.add_argument("--check", action="store_true", help="list the files and compare them with the manifest instead of writing one (exit 1 naming the "
                   "first file added, removed or changed)")
    p.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is not a terminal")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(fn=cmd_index)
