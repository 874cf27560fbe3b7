"""Many shards, every format. Once ``zephon index`` has written the manifest, a source of 10,000 shards
opens none of them at start-up, counts every document, and a read opens only the shards it reads. A source
holds at most ``Access.max_open_files`` shards open, whatever it has read, with the same documents. One real
shard per format is written by the library that owns it and linked 10,000 times (the content of a shard does
not matter here; their number does). Wall time is a benchmark's business (P7, bench/), not a test's: these
count what start-up touches."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from support.core_fixtures import zephon_cache_dir  # noqa: F401  (autouse: a private cache per test)

from zephon_core import ArrowSource, MdsSource, MegatronIndexedSource, WebDatasetSource
from zephon_core.cli import main
from zephon_core.io.files import Access
from zephon_core.sources import manifest
from zephon_core.sources.arrow import ArrowFile
from zephon_core.sources.megatron import MegatronIndexedFile
from zephon_core.sources.webdataset import WebDatasetFile

SHARDS = 10_000
TEXTS = ["first document: é 中", "second document", "third"]


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _link(one: Path, names: list[Path]) -> None:
    for name in names:
        os.link(one, name)
    one.unlink()


def webdataset_shards(folder: Path, shards: int = SHARDS) -> list[str]:
    import webdataset as wds

    folder.mkdir()
    with wds.TarWriter(str(folder / "one.tar")) as w:
        for j, text in enumerate(TEXTS):
            w.write({"__key__": f"s{j:03d}", "txt": text, "json": {"j": j}})
    _link(folder / "one.tar", [folder / f"shard-{k:05d}.tar" for k in range(shards)])
    return ["--format", "webdataset"]


def arrow_shards(folder: Path, shards: int = SHARDS) -> list[str]:
    """A ``save_to_disk`` folder: datasets writes one shard and its state.json; the 10,000 shards are that
    shard linked under datasets' own names, listed in state.json as datasets lists them."""
    import datasets

    datasets.Dataset.from_dict({"text": TEXTS}).save_to_disk(str(folder), num_shards=1)
    state = json.loads((folder / "state.json").read_text())
    (one,) = state["_data_files"]
    names = [f"data-{k:05d}-of-{shards:05d}.arrow" for k in range(shards)]
    _link(folder / one["filename"], [folder / n for n in names])
    state["_data_files"] = [{"filename": n} for n in names]
    (folder / "state.json").write_text(json.dumps(state))
    return ["--format", "arrow"]


def megatron_shards(folder: Path, shards: int = SHARDS) -> list[str]:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    folder.mkdir()
    builder = IndexedDatasetBuilder(str(folder / "one.bin"), dtype=np.int32)
    for j in range(len(TEXTS)):
        builder.add_document(torch.arange(j + 1, dtype=torch.int32) * 7, [j + 1])
    builder.finalize(str(folder / "one.idx"))
    for suffix in (".bin", ".idx"):
        _link(folder / f"one{suffix}", [folder / f"part-{k:05d}_text_document{suffix}" for k in range(shards)])
    return ["--format", "megatron"]


FORMATS = {
    "webdataset": (webdataset_shards, WebDatasetSource, WebDatasetFile, TEXTS),
    "arrow": (arrow_shards, ArrowSource, ArrowFile, TEXTS),
    "megatron": (megatron_shards, MegatronIndexedSource, MegatronIndexedFile,
                 [[7 * i for i in range(j + 1)] for j in range(3)]),
}


def _as_plain(doc):
    return doc if isinstance(doc, str) else [int(t) for t in doc]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_manifest_start_up_at_ten_thousand_shards_opens_none_and_a_read_opens_only_its_shards(
        fmt, tmp_path, monkeypatch, capsys):
    make, source_cls, file_cls, per_shard = FORMATS[fmt]
    folder = tmp_path / "corpus"
    args = make(folder)
    assert main(["index", str(folder), *args]) == 0
    assert f"{SHARDS} files, {SHARDS * len(per_shard)} documents" in capsys.readouterr().out
    assert (folder / manifest.MANIFEST).exists()
    opened: list[str] = []
    original = file_cls.__init__
    monkeypatch.setattr(file_cls, "__init__", lambda self, *a, **k: opened.append(str(a[0])) or original(self, *a, **k))
    src = source_cls(str(folder))
    assert opened == [], f"start-up from the manifest opened {len(opened)} shards"
    n = len(per_shard)
    assert len(src) == SHARDS * n
    last, first = SHARDS * n - 1, 1
    assert [_as_plain(d) for d in src.read([last, first])] == [per_shard[-1], per_shard[1]]
    assert len(opened) == 2 and {"09999", "00000"} == {k for k in ("09999", "00000") for o in opened if k in o}, opened


def test_mds_start_up_at_ten_thousand_shards_reads_index_json_alone(tmp_path, monkeypatch):
    """MDS keeps its own manifest (``index.json``, written by ``MDSWriter``): start-up reads it and no shard."""
    from streaming import MDSWriter

    from zephon_core.sources import mds_shard

    with MDSWriter(out=str(tmp_path / "big"), columns={"text": "str"}, size_limit=120) as w:  # one sample per shard
        for d in range(SHARDS):
            w.write({"text": f"document {d} " + "z" * 60})
    shard_reads: list[str] = []
    original = mds_shard.MdsShard.__init__
    monkeypatch.setattr(mds_shard.MdsShard, "__init__",
                        lambda self, *a, **k: shard_reads.append(str(a[0])) or original(self, *a, **k))
    src = MdsSource(str(tmp_path / "big"))
    assert len(src) == SHARDS and shard_reads == []
    assert src.read([SHARDS - 1, 0]) == [f"document {SHARDS - 1} " + "z" * 60, "document 0 " + "z" * 60]
    assert len(shard_reads) == 2


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_source_holds_at_most_max_open_files_shards_open_and_reads_the_same_documents(fmt, tmp_path):
    FORMATS[fmt][0](tmp_path / "corpus", 40)
    source_cls = FORMATS[fmt][1]
    unbounded = source_cls(str(tmp_path / "corpus"), access=Access(manifest=False, max_open_files=1_000))
    before = _open_descriptors()
    every = [_as_plain(d) for d in unbounded.read(list(range(len(unbounded))))]
    held_unbounded = _open_descriptors() - before
    del unbounded
    before = _open_descriptors()
    bounded = source_cls(str(tmp_path / "corpus"), access=Access(manifest=False, max_open_files=3))
    got = []
    for a in range(0, len(bounded), 7):  # a few shards a read, every shard in turn
        got += [_as_plain(d) for d in bounded.read(list(range(a, min(len(bounded), a + 7))))]
        held = _open_descriptors() - before
        assert held <= 3 * 3, f"{held} descriptors open with max_open_files=3"
    assert got == every and len(got) == 40 * len(FORMATS[fmt][3])
    if held_unbounded:  # (a format that reads a shard whole holds nothing open: nothing to bound)
        assert held_unbounded >= 40, f"the unbounded source held {held_unbounded} descriptors for 40 shards"


def test_a_slow_open_of_one_shard_does_not_hold_up_reads_of_shards_already_open(tmp_path, monkeypatch):
    """On a store an open is a request: a reader thread opening one shard must not stall the threads reading
    shards that are open already (the open-file table is locked only to look up and insert)."""
    import threading

    webdataset_shards(tmp_path / "corpus", 3)
    # Start-up keeps open only the first max_open_files shards it scanned: shard 0 here.
    source = WebDatasetSource(str(tmp_path / "corpus"), access=Access(manifest=False, max_open_files=1))
    first = source.read([0])
    opening, release = threading.Event(), threading.Event()
    real_open = WebDatasetSource.open_file

    def slow_open(self, url, *a, **kw):
        if url.endswith("shard-00002.tar"):
            opening.set()
            assert release.wait(30), "the test never released the slow open"
        return real_open(self, url, *a, **kw)

    monkeypatch.setattr(WebDatasetSource, "open_file", slow_open)
    late: list = []
    slow = threading.Thread(target=lambda: late.append(source.read([2 * len(TEXTS)])))
    slow.start()
    try:
        assert opening.wait(10)
        done: list = []
        fast = threading.Thread(target=lambda: done.append(source.read([0])))
        fast.start()
        fast.join(5)
        assert done == [first], "a read of an open shard waited for another shard's open"
    finally:
        release.set()
        slow.join(10)
    assert late == [first], "the slowly opened shard (the same shard linked) read other documents"
