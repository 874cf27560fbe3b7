"""The index cache's one key rule, the same for every indexed format (``indexed_file.IndexedFile``):
the same file version reuses the cached index, a changed version rebuilds it, an unknown version caches nothing."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from zephon_core.io.files import Access, FileStat
from zephon_core.sources.arrow import ArrowFile
from zephon_core.sources.indexed_file import IndexedFile
from zephon_core.sources.jsonl import JsonlFile
from zephon_core.sources.webdataset import WebDatasetFile

TEXTS = ["alpha", "beta", "gamma"]


def _jsonl(path: Path) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return path


def _tar(path: Path) -> Path:
    with tarfile.open(path, "w") as tar:
        for i, t in enumerate(TEXTS):
            data = t.encode()
            info = tarfile.TarInfo(f"{i:06d}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _arrow(path: Path) -> Path:
    import pyarrow as pa

    table = pa.table({"text": TEXTS})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=2)  # two record batches
    return path


FORMATS = [pytest.param(JsonlFile, _jsonl, "a.jsonl", id="jsonl"),
           pytest.param(WebDatasetFile, _tar, "a.tar", id="webdataset"),
           pytest.param(ArrowFile, _arrow, "a.arrow", id="arrow")]


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files whose index was built by a scan (not taken from the cache), in order."""
    seen: list[str] = []
    for cls in (JsonlFile, WebDatasetFile, ArrowFile):
        original = cls._build_index

        def counted(self: IndexedFile, *whole: Any, _original: Any = original) -> Any:
            seen.append(self.path)
            return _original(self, *whole)

        monkeypatch.setattr(cls, "_build_index", counted)
    return seen


def _open(cls: type[IndexedFile], path: Path, cache: Path, etag: str | None) -> IndexedFile:
    stat = FileStat(str(path), path.stat().st_size, etag)
    return cls(str(path), access=Access(cache_dir=str(cache)), stat=stat)  # type: ignore[call-arg]


@pytest.mark.parametrize(("cls", "write", "filename"), FORMATS)
def test_same_version_reuses_the_index(tmp_path: Path, builds: list[str], cls: type[IndexedFile], write: Any,
                                       filename: str) -> None:
    path, cache = write(tmp_path / filename), tmp_path / "cache"
    first = _open(cls, path, cache, "v1")
    again = _open(cls, path, cache, "v1")
    assert builds == [str(path)]
    assert again.read(range(3)) == first.read(range(3)) == TEXTS


@pytest.mark.parametrize(("cls", "write", "filename"), FORMATS)
def test_changed_version_rebuilds(tmp_path: Path, builds: list[str], cls: type[IndexedFile], write: Any,
                                  filename: str) -> None:
    path, cache = write(tmp_path / filename), tmp_path / "cache"
    _open(cls, path, cache, "v1")
    _open(cls, path, cache, "v2")  # same bytes, same fingerprint: only the version says it changed
    _open(cls, path, cache, "v2")
    assert builds == [str(path)] * 2


@pytest.mark.parametrize(("cls", "write", "filename"), FORMATS)
def test_unknown_version_caches_nothing(tmp_path: Path, builds: list[str], monkeypatch: pytest.MonkeyPatch,
                                        cls: type[IndexedFile], write: Any, filename: str) -> None:
    path, cache = write(tmp_path / filename), tmp_path / "cache"
    monkeypatch.setattr(IndexedFile, "_version", lambda self, stat: None)  # neither listing nor file system knows
    assert _open(cls, path, cache, None).read(range(3)) == TEXTS
    _open(cls, path, cache, None)
    assert builds == [str(path)] * 2
    assert not cache.exists() or not any(cache.iterdir())


@pytest.mark.parametrize(("cls", "write", "filename"), FORMATS)
def test_the_listing_version_comes_first(tmp_path: Path, cls: type[IndexedFile], write: Any, filename: str) -> None:
    path, cache = write(tmp_path / filename), tmp_path / "cache"
    one = _open(cls, path, cache, "etag-1")
    assert one._version(FileStat(str(path), 1, "etag-1", 5.0)) == "etag-1"
    assert one._version(FileStat(str(path), 1, None, 5.0)) == 5.0
    assert one._version(None) == path.stat().st_mtime  # else the file system's
