"""One atomic write (io/atomic.py) for the index cache, the shard cache, the manifest and the
aggregation folder: a reader sees the old file, no file or the whole new one, and a failure midway
leaves neither a partial file nor a temporary one."""

from __future__ import annotations

import os
import stat

import fsspec
import pytest

from zephon_core.io.atomic import TMP_PREFIX, LocalFiles, put_atomically, write_atomically
from zephon_core.io.shard_cache import ShardCache


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


def test_a_torn_shard_cache_entry_is_made_again_never_trusted(tmp_path):
    """After a power loss a renamed entry may be short or empty, or have no record of its size (an entry of an
    older Zephon, or a crash before the record was written): each is made again, not read."""
    cache = ShardCache(tmp_path / "c")
    whole = b"the whole shard " * 64
    made = []

    def make(f):
        made.append(1)
        f.write(whole)

    path = cache.get("k", make)
    assert path.read_bytes() == whole and len(made) == 1
    assert cache.get("k", make).read_bytes() == whole and len(made) == 1, "an intact entry is a hit"
    for tear in (lambda: path.write_bytes(whole[:100]), lambda: path.write_bytes(b""),
                 lambda: [p.unlink() for p in (tmp_path / "c").iterdir() if p != path]):
        tear()
        assert cache.get("k", make).read_bytes() == whole, "a torn entry is made again"
    assert len(made) == 4


def test_a_shard_cache_entry_is_synced_before_its_rename_and_its_folder_after(tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("rename", os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    path = ShardCache(tmp_path / "c").get("k", lambda f: f.write(b"data"))
    entry = events.index(("rename", path.name))
    assert ("fsync", "file") in events[:entry], events
    assert ("fsync", "folder") in events[entry + 1 :], events
