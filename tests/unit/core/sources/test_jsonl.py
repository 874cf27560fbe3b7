"""JSONL: random reads, its index and the index cache, errors naming file and line, fsspec URLs."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from support.core_fixtures import write_jsonl, zephon_cache_dir  # noqa: F401  (autouse fixture)

from zephon_core import DataError, JsonlSource
from zephon_core.sources import jsonl as jsonl_module
from zephon_core.sources.jsonl import JsonlFile

TEXTS = [f"document {i} " + "é→😀"[i % 3] * (i % 5) for i in range(40)]


def _random_order(n, seed=0):
    return np.random.default_rng(seed).permutation(n).tolist()


@pytest.fixture
def jsonl_file(tmp_path):
    return write_jsonl(tmp_path / "docs.jsonl", [{"id": i, "text": t} for i, t in enumerate(TEXTS)])


def test_jsonl_reads_the_right_records_in_random_order(jsonl_file):
    src = JsonlSource(str(jsonl_file))
    assert len(src) == len(TEXTS)
    order = _random_order(len(TEXTS))
    assert src.read(order) == [TEXTS[i] for i in order]
    assert src.read([3, 3, 0]) == [TEXTS[3], TEXTS[3], TEXTS[0]]
    assert src.read([]) == []
    assert src.name == "docs.jsonl"


def test_jsonl_whole_records_and_other_fields(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"body": f"b{i}", "n": i} for i in range(5)])
    assert JsonlSource(str(path), text_field="body").read([4, 1]) == ["b4", "b1"]
    assert JsonlSource(str(path), text_field=None).read([2]) == [{"body": "b2", "n": 2}]


def test_jsonl_out_of_range_index_raises(jsonl_file):
    src = JsonlSource(str(jsonl_file))
    with pytest.raises(IndexError):
        src.read([len(TEXTS)])


def test_jsonl_blank_lines_crlf_and_missing_final_newline(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_bytes(b'\n{"text": "a"}\r\n   \n\n{"text": "b"}\r\n\t\n{"text": "c"}')
    src = JsonlSource(str(path))
    assert len(src) == 3
    assert src.read([2, 0, 1]) == ["c", "a", "b"]


def test_jsonl_block_boundaries_do_not_matter(tmp_path, monkeypatch):
    records = [{"text": "x" * (i % 17) + str(i)} for i in range(60)]
    path = write_jsonl(tmp_path / "blocks.jsonl", records)
    monkeypatch.setattr(jsonl_module, "_READ_BLOCK", 7)  # far shorter than a line
    src = JsonlSource(str(path), cache_dir=str(tmp_path / "c1"))
    order = _random_order(60, 3)
    assert src.read(order) == [records[i]["text"] for i in order]


def test_jsonl_reads_from_many_threads(jsonl_file):
    src = JsonlSource(str(jsonl_file))
    errors = []

    def work(seed):
        order = _random_order(len(TEXTS), seed)
        for _ in range(20):
            if src.read(order) != [TEXTS[i] for i in order]:
                errors.append(seed)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_jsonl_index_is_cached(jsonl_file, monkeypatch, zephon_cache_dir):  # noqa: F811
    first = JsonlSource(str(jsonl_file))
    assert list(zephon_cache_dir.glob("*.npz")), "the index was not written to ZEPHON_CACHE_DIR"

    def boom(self, *whole):
        raise AssertionError("index rebuilt although a valid cache exists")

    monkeypatch.setattr(JsonlFile, "_build_index", boom)
    second = JsonlSource(str(jsonl_file))
    order = _random_order(len(TEXTS), 5)
    assert second.read(order) == first.read(order)


def test_jsonl_explicit_cache_dir(jsonl_file, tmp_path):
    cache = tmp_path / "explicit"
    JsonlSource(str(jsonl_file), cache_dir=str(cache))
    assert len(list(cache.glob("*.npz"))) == 1


def test_jsonl_changed_file_is_reindexed(tmp_path, monkeypatch):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "ab"}\n{"text": "c"}\n')
    assert JsonlSource(str(path)).read([0, 1]) == ["ab", "c"]
    # Same size, different line lengths: a stale index would cut the lines wrong.
    path.write_text('{"text": "a"}\n{"text": "bc"}\n')
    calls = []
    original = JsonlFile._build_index
    monkeypatch.setattr(JsonlFile, "_build_index", lambda self, *whole: calls.append(1) or original(self, *whole))
    assert JsonlSource(str(path)).read([1, 0]) == ["bc", "a"]
    assert calls == [1]
    # Appending a record is seen too.
    with open(path, "a") as f:
        f.write('{"text": "d"}\n')
    src = JsonlSource(str(path))
    assert len(src) == 3 and src.read([2]) == ["d"]
    assert calls == [1, 1]


def test_jsonl_corrupt_cache_is_ignored(jsonl_file, zephon_cache_dir):  # noqa: F811
    JsonlSource(str(jsonl_file))
    for f in zephon_cache_dir.glob("*.npz"):
        f.write_bytes(b"not an npz file at all")
    src = JsonlSource(str(jsonl_file))
    assert src.read([7]) == [TEXTS[7]]


def test_jsonl_fingerprint_tracks_content_not_path(tmp_path, jsonl_file):
    copy = tmp_path / "moved" / "docs.jsonl"
    copy.parent.mkdir()
    copy.write_bytes(jsonl_file.read_bytes())
    assert JsonlSource(str(copy)).fingerprint() == JsonlSource(str(jsonl_file)).fingerprint()
    other = write_jsonl(tmp_path / "o.jsonl", [{"text": t.upper()} for t in TEXTS])
    assert JsonlSource(str(other)).fingerprint() != JsonlSource(str(jsonl_file)).fingerprint()
    assert JsonlSource(str(jsonl_file), text_field=None).fingerprint() != JsonlSource(str(jsonl_file)).fingerprint()


@pytest.mark.parametrize(
    "content, line, words",
    [
        (b'{"text": "a"}\n{"text": "b"}\n{"text": "c"\n', 3, ["malformed JSON"]),
        (b'{"text": "a"}\n\n{"body": "b"}\n', 3, ["missing field", "'text'"]),
        (b'{"text": "a"}\n{"text": 5}\n', 2, ["'text'", "string", "int"]),
        (b'{"text": "a"}\n{"text": null}\n', 2, ["'text'", "string"]),
        (b'{"text": "a"}\n{"text": "\xff\xfe"}\n', 2, ["UTF-8"]),
        (b'{"text": "a"}\n["text"]\n', 2, ["JSON object", "list"]),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path, content, line, words):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(DataError) as e:
        JsonlSource(str(path))
    msg = str(e.value)
    assert f"{path}:{line}:" in msg
    for w in words:
        assert w in msg


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
def test_jsonl_empty_file(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    with pytest.raises(DataError) as e:
        JsonlSource(str(path))
    assert str(path) in str(e.value) and "no documents" in str(e.value)


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(DataError) as e:
        JsonlSource(str(tmp_path / "nope.jsonl"))
    assert "nope.jsonl" in str(e.value)


def test_sources_are_closed_cleanly(tmp_path):
    path = write_jsonl(tmp_path / "fd.jsonl", [{"text": "x"}])
    src = JsonlSource(str(path))
    src.read([0])
    fd = src.file(0)._bytes._fd  # the descriptor of its one file
    assert fd is not None
    del src
    with pytest.raises(OSError):
        os.fstat(fd)


def test_jsonl_carriage_return_inside_a_record_is_whitespace(tmp_path):
    """JSON Lines are separated by \\n; a \\r between JSON tokens is ordinary whitespace."""
    path = tmp_path / "cr.jsonl"
    path.write_bytes(b'{"text":\r "a"}\n{"text": "b"}\r\n')
    src = JsonlSource(str(path))
    assert src.read([0, 1]) == ["a", "b"]


def test_jsonl_stale_cache_of_a_large_file_edited_in_the_middle(tmp_path):
    """An edit that keeps the size but moves line boundaries must not reuse the old index.

    The content fingerprint samples only the first and last MiB, so the cache
    needs more than that (e.g. the file's mtime) to notice the edit.
    """
    path = tmp_path / "big.jsonl"
    lines = [f'{{"text": "{i:06d}{"x" * 100}"}}' for i in range(30000)]  # ~3.4 MiB
    path.write_text("\n".join(lines) + "\n")
    assert JsonlSource(str(path)).read([15000]) == [f"{15000:06d}" + "x" * 100]
    size = path.stat().st_size
    lines[15000] = f'{{"text": "{15000:06d}{"x" * 99}"}}'
    lines[15001] = f'{{"text": "{15001:06d}{"x" * 101}"}}'
    path.write_text("\n".join(lines) + "\n")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a later mtime, as any real edit has
    assert path.stat().st_size == size
    src = JsonlSource(str(path))
    assert src.read([15000, 15001, 29999]) == [
        f"{15000:06d}" + "x" * 99,
        f"{15001:06d}" + "x" * 101,
        f"{29999:06d}" + "x" * 100,
    ]
