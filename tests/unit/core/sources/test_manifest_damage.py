"""A damaged index manifest or index sidecar (``zephon index``'s files) is a one-line ``DataError`` naming the file
and the fix, never a raw zip or JSON error and never a silently different index."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.core_fixtures import zephon_cache_dir  # noqa: F401  (autouse: a private index cache per test)

from zephon_core import DataError, JsonlSource
from zephon_core.io.files import INDEX_DIR, MANIFEST, Access
from zephon_core.sources import manifest


def indexed(folder: Path) -> JsonlSource:
    """Two JSONL shards and the manifest ``zephon index`` would write for them (with each file's index sidecar)."""
    folder.mkdir()
    for k in range(2):
        (folder / f"part-{k}.jsonl").write_text("".join(json.dumps({"text": f"s{k}d{j}"}) + "\n" for j in range(3)))
    src = JsonlSource(str(folder), access=Access(manifest=False))
    indexes = {m.name: src.index_arrays(f) for f, m in enumerate(src.metas)}
    manifest.write_manifest(src.files, src.kind, src.manifest_options(), src.metas, indexes)
    return src


def one_line_naming(e: pytest.ExceptionInfo[DataError], path: Path) -> str:
    msg = str(e.value)
    assert str(path) in msg and "zephon index" in msg and "\n" not in msg, msg
    return msg


def test_a_truncated_index_sidecar_is_a_data_error_naming_it_and_the_fix(tmp_path):
    src = indexed(tmp_path / "d")
    sidecar = tmp_path / "d" / INDEX_DIR / "part-1.jsonl.npz"
    sidecar.write_bytes(sidecar.read_bytes()[:-30])
    with pytest.raises(DataError) as e:
        manifest.read_index(src.files, "part-1.jsonl")
    one_line_naming(e, sidecar)
    reread = JsonlSource(str(tmp_path / "d"))
    with pytest.raises(DataError) as e:
        reread.read([4])  # part-1's first read opens it, with its sidecar
    one_line_naming(e, sidecar)


def test_every_flipped_byte_of_an_index_sidecar_reads_the_same_index_or_is_refused_naming_it(tmp_path):
    src = indexed(tmp_path / "d")
    sidecar = tmp_path / "d" / INDEX_DIR / "part-0.jsonl.npz"
    good, whole = manifest.read_index(src.files, "part-0.jsonl", src.index_keys), sidecar.read_bytes()
    assert good is not None
    refused = 0
    for i in range(len(whole)):
        flipped = bytearray(whole)
        flipped[i] ^= 0xFF
        sidecar.write_bytes(bytes(flipped))
        try:
            got = manifest.read_index(src.files, "part-0.jsonl", src.index_keys)
        except DataError as e:
            refused += 1
            assert str(sidecar) in str(e) and "\n" not in str(e)
            continue
        assert got is not None and got.keys() == good.keys() and all(np.array_equal(got[k], good[k]) for k in good), i
    assert refused


def test_a_truncated_or_flipped_manifest_is_a_data_error_naming_it_and_the_fix(tmp_path):
    indexed(tmp_path / "d")
    path = tmp_path / "d" / MANIFEST
    whole = path.read_bytes()
    for damaged in (whole[: len(whole) // 2], whole[:1] + b"\xff" + whole[2:]):
        path.write_bytes(damaged)
        with pytest.raises(DataError) as e:
            JsonlSource(str(tmp_path / "d"))
        one_line_naming(e, path)
