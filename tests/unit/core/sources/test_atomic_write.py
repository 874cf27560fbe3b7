"""One atomic write (sources/atomic.py) for the index cache, the shard cache, the manifest and the
aggregation folder: a reader sees the old file, no file or the whole new one, and a failure midway
leaves neither a partial file nor a temporary one."""

from __future__ import annotations

import os
import stat

import fsspec
import pytest

from zephon_core.sources.atomic import TMP_PREFIX, LocalFiles, put_atomically, write_atomically
from zephon_core.sources.shard_cache import ShardCache


class Boom(Exception):
    pass


def _fail_midway(f):
    f.write(b"half of the new")
    f.flush()
    raise Boom


def test_a_failure_midway_leaves_the_old_file_and_no_temporary_one(tmp_path):
    target = tmp_path / "file.bin"
    write_atomically(target, lambda f: f.write(b"old"))
    with pytest.raises(Boom):
        write_atomically(target, _fail_midway)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["file.bin"], "no partial or temporary file is left"
    with pytest.raises(Boom):
        write_atomically(tmp_path / "new.bin", _fail_midway)
    assert os.listdir(tmp_path) == ["file.bin"], "a file that did not exist still does not"


def test_the_file_appears_whole_with_mode_644_under_any_umask(tmp_path):
    target = tmp_path / "file.bin"
    seen = []

    def write(f):
        f.write(b"a" * 1000)
        seen.append(target.exists())  # not there while being written
        f.write(b"b" * 1000)

    old = os.umask(0)
    try:
        write_atomically(target, write)
    finally:
        os.umask(old)
    assert seen == [False] and target.read_bytes() == b"a" * 1000 + b"b" * 1000
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


class CountingFiles(LocalFiles):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def create(self, folder):
        self.calls.append("create")
        return super().create(folder)

    def rename(self, src, dst):
        self.calls.append("rename")
        assert os.path.basename(src).startswith(TMP_PREFIX)
        super().rename(src, dst)

    def delete(self, path):
        self.calls.append("delete")
        super().delete(path)


def test_each_operation_goes_through_the_given_files(tmp_path):
    files = CountingFiles()
    write_atomically(tmp_path / "a", lambda f: f.write(b"x"), files)
    with pytest.raises(Boom):
        write_atomically(tmp_path / "b", _fail_midway, files)
    assert files.calls == ["create", "rename", "create", "delete"]
    assert os.listdir(tmp_path) == ["a"]


def test_put_makes_the_folder_on_a_file_system_and_puts_once_on_a_store(tmp_path):
    put_atomically(fsspec.filesystem("file"), str(tmp_path / "deep" / "er" / "m.json"), b"{}")
    assert (tmp_path / "deep" / "er" / "m.json").read_bytes() == b"{}"
    store = fsspec.filesystem("memory")
    put_atomically(store, "/bucket/m.json", b"{}")
    assert store.cat_file("/bucket/m.json") == b"{}"


def test_a_shard_cache_entry_made_halfway_is_not_an_entry(tmp_path):
    cache = ShardCache(tmp_path / "c")
    with pytest.raises(Boom):
        cache.get("k", _fail_midway)
    assert os.listdir(tmp_path / "c") == []
    assert cache.get("k", lambda f: f.write(b"whole")).read_bytes() == b"whole"


def test_eviction_never_removes_an_entry_still_being_written(tmp_path):
    """Another pipeline of the node evicts while this one writes: its temporary file is not an entry."""
    cache = ShardCache(tmp_path / "c", max_bytes=150)

    def make_while_another_evicts(f):
        f.write(b"a" * 100)
        f.flush()
        ShardCache(tmp_path / "c", max_bytes=150).get("other", lambda g: g.write(b"b" * 100))

    assert cache.get("mine", make_while_another_evicts).read_bytes() == b"a" * 100
