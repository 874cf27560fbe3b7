"""The Arrow source (``format = "arrow"``): the files Hugging Face ``datasets`` writes, read as ``load_from_disk``
reads them, locally (memory-mapped), on S3 through injected faults, from a manifest, and through ``hf://``.

Every dataset here is written by ``datasets`` itself (``save_to_disk``); the IPC file format and the
corrupt cases are written by pyarrow, which owns the format.
"""

from __future__ import annotations

import importlib
import json
import shutil
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import datasets
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.core_fixtures import CharTokenizer, epoch_exactly_once, zephon_cache_dir  # noqa: F401  (autouse: a private index cache per test)

from zephon_core import ArrowSource, DataError, ParquetSource, Pipeline, StaticMixture
from zephon_core.cli import main
from zephon_core.io.byte_access import SMALL_OBJECT_BYTES
from zephon_core.recipe import load_recipe
from zephon_core.sources import manifest
from zephon_core.sources.arrow import ArrowFile
from zephon_core.sources.registry import guess_format
from zephon_dev.s3_proxy import S3Proxy, every, through

datasets.disable_progress_bars()


def texts_of(n: int, tag: str = "d", width: int = 13) -> list[str]:
    return [f"{tag}{j}:" + "abcdefghijklmnopqrstuvwxyz"[: j % width] for j in range(n)]


@contextmanager
def batches_of(rows: int | None):
    """``save_to_disk`` writes record batches of ``datasets.config.DEFAULT_MAX_BATCH_SIZE`` rows (1000): fewer, to test many."""
    if rows is None:
        yield
        return
    with mock.patch.object(datasets.config, "DEFAULT_MAX_BATCH_SIZE", rows):
        yield


def save(folder: Path, texts: list[str], shards: int = 1, batch: int | None = None, **columns: list) -> Path:
    with batches_of(batch):
        datasets.Dataset.from_dict({"text": texts, "n": list(range(len(texts))), **columns}).save_to_disk(str(folder), num_shards=shards)
    return folder


def all_docs(src) -> list:
    return src.read(list(range(len(src))))


def ipc(path: Path, table: pa.Table, *, file_format: bool, rows: int) -> Path:
    with pa.OSFile(str(path), "wb") as sink:
        with (pa.ipc.new_file if file_format else pa.ipc.new_stream)(sink, table.schema) as w:
            for b in table.to_batches(max_chunksize=rows):
                w.write_batch(b)
    return path


# -- what datasets writes, as load_from_disk reads it ---------------------------------------------
def test_a_saved_dataset_reads_as_load_from_disk_does_and_map_cache_files_are_not_part_of_it(tmp_path):
    texts = texts_of(230)
    save(tmp_path / "ds", texts, shards=4, batch=16)
    datasets.load_from_disk(str(tmp_path / "ds")).map(lambda r: {"text": r["text"].upper()})  # leaves a cache-*.arrow beside the shards
    assert any(p.name.startswith("cache-") for p in (tmp_path / "ds").iterdir())
    src = ArrowSource(str(tmp_path / "ds"))
    assert len(src.metas) == 4 and [m.name for m in src.metas] == [f"data-{k:05d}-of-00004.arrow" for k in range(4)]
    assert all_docs(src) == list(datasets.load_from_disk(str(tmp_path / "ds"))["text"]) == texts
    assert src.file(1).index_arrays["rows"].tolist() == [16, 16, 16, 10]  # 58 rows (230 in 4 shards) in record batches of 16
    picked = [229, 0, 57, 58, 3, 200, 57]
    assert src.read(picked) == [texts[i] for i in picked]
    shutil.copytree(tmp_path / "ds", tmp_path / "moved")
    assert ArrowSource(str(tmp_path / "moved")).fingerprint() == src.fingerprint(), "the fingerprint is the data's, not the path's"
    assert src.fingerprint()["kind"] == "arrow" and src.fingerprint()["text_field"] == "text"


def test_a_dataset_dict_is_read_by_split_and_its_root_folder_is_refused(tmp_path):
    train, test = texts_of(40, "tr"), texts_of(7, "te")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": train}), "test": datasets.Dataset.from_dict({"text": test})})
    dd.save_to_disk(str(tmp_path / "dd"), num_shards={"train": 3, "test": 1})
    loaded = datasets.load_from_disk(str(tmp_path / "dd"))
    for split in ("train", "test"):
        src = ArrowSource(str(tmp_path / "dd" / split))
        assert all_docs(src) == list(loaded[split]["text"]) and src.name == split
    with pytest.raises(DataError, match=r"dd: a DatasetDict folder \(splits train, test\): name one split's folder, e\.g\. .*dd/train$"):
        ArrowSource(str(tmp_path / "dd"))


def test_a_split_missing_a_file_its_state_json_lists_is_refused_naming_it(tmp_path):
    save(tmp_path / "ds", texts_of(30), shards=3)
    (tmp_path / "ds" / "data-00001-of-00003.arrow").unlink()
    with pytest.raises(DataError, match=r"state\.json lists 3 files, the folder holds 2 of them \(data-00001-of-00003\.arrow is missing\)"):
        ArrowSource(str(tmp_path / "ds"))


@pytest.mark.parametrize("file_format", [False, True])
def test_the_stream_and_the_file_format_read_alike_by_record_batch(tmp_path, file_format):
    texts = texts_of(100)
    table = pa.table({"id": pa.array(range(100)), "text": pa.array(texts, type=pa.large_string())})
    src = ArrowSource(str(ipc(tmp_path / "a.arrow", table, file_format=file_format, rows=7)))
    assert src.read(list(range(100))) == texts and src.read([99, 0, 50]) == [texts[99], texts[0], texts[50]]
    assert src.file(0).index_arrays["rows"].tolist() == [7] * 14 + [2]


# -- manifests -------------------------------------------------------------------------------------
def test_zephon_index_writes_a_manifest_that_start_up_uses_without_opening_a_data_file(tmp_path, monkeypatch, capsys):
    texts = texts_of(120)
    save(tmp_path / "ds", texts, shards=12, batch=4)
    assert main(["index", str(tmp_path / "ds"), "--format", "arrow"]) == 0
    assert "12 files, 120 documents" in capsys.readouterr().out
    assert (tmp_path / "ds" / manifest.MANIFEST).exists() and len(list((tmp_path / "ds" / manifest.INDEX_DIR).glob("*.npz"))) == 12
    opened, scanned = [], []
    original_init, original_scan = ArrowFile.__init__, ArrowFile._build_index
    monkeypatch.setattr(ArrowFile, "__init__", lambda self, *a, **k: opened.append(a[0]) or original_init(self, *a, **k))
    monkeypatch.setattr(ArrowFile, "_build_index",
                        lambda self, *a: scanned.append(self.path) or original_scan(self, *a))
    src = ArrowSource(str(tmp_path / "ds"))
    assert opened == [] and len(src) == 120, "start-up from a manifest opens no data file"
    assert src.read([119, 5]) == [texts[119], texts[5]] and len(opened) == 2 and scanned == [], "the index is the manifest's"
    assert src.fingerprint() == ArrowSource(str(tmp_path / "ds"), use_manifest=False).fingerprint()
    assert main(["index", str(tmp_path / "ds"), "--format", "arrow", "--check"]) == 0


# -- the data contract -----------------------------------------------------------------------------
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(1, 9), min_size=1, max_size=5), st.sampled_from([2, 5, None]), st.sampled_from([None, 2, 3]),
       st.sampled_from([(1, 2), (2, 4), (4, 1)]), st.integers(0, 3))
def test_every_document_of_an_epoch_is_delivered_exactly_once_across_shards_resizes_and_restores(tmp_path_factory, sizes, batch, block, topo,
                                                                                                 first):
    folder = tmp_path_factory.mktemp("ds")
    texts = texts_of(sum(sizes))
    save(folder, texts, shards=len(sizes), batch=batch)
    delivered = epoch_exactly_once(lambda: ArrowSource(str(folder)), CharTokenizer(), block=block, G1=topo[0], G2=topo[1], first=first)
    assert delivered == texts


def test_a_restore_is_a_seek_that_continues_as_the_uninterrupted_run(tmp_path, monkeypatch):
    texts = texts_of(400, width=26)
    save(tmp_path / "ds", texts, shards=5, batch=32)

    def pipeline() -> Pipeline:
        ws = StaticMixture([ArrowSource(str(tmp_path / "ds"))], seed=4, chunk_size=8)
        return Pipeline(ws).tokenize(CharTokenizer(), eos_id=0).pack(32).batch(2).options(prefetch=0, reader_threads=0)

    whole = pipeline()
    it = iter(whole)
    straight = [next(it).digest for _ in range(60)]
    first = pipeline()
    it = iter(first)
    assert [next(it).digest for _ in range(40)] == straight[:40]
    state = first.checkpoint()
    read: list[int] = []
    original = ArrowFile.read
    monkeypatch.setattr(ArrowFile, "read", lambda self, idx: read.extend(idx) or original(self, idx))
    resumed = pipeline()
    resumed.restore(state)
    it = iter(resumed)
    assert next(it).digest == straight[40]
    assert len(read) <= 24, f"a restore reads about one chunk, not the {40 * 2 * 33 // 20} documents before it: {len(read)}"
    assert [next(it).digest for _ in range(19)] == straight[41:]


# -- object stores ---------------------------------------------------------------------------------
def test_a_saved_dataset_on_s3_reads_like_local_disk_through_injected_faults(s3_endpoint, tmp_path):
    # Two shards of ~2.2 MB (over the size fetched whole at start-up: indexed in one pass, read by range)
    # in batches of 200 rows.
    texts = [f"s3doc{j}-" + "w" * (900 + j % 211) for j in range(4400)]
    save(tmp_path / "ds", texts, shards=2, batch=200)
    assert all(p.stat().st_size > SMALL_OBJECT_BYTES for p in (tmp_path / "ds").glob("*.arrow"))
    fs = s3_endpoint.filesystem()
    fs.put(str(tmp_path / "ds"), f"{s3_endpoint.bucket}/hf/ds", recursive=True)
    url = s3_endpoint.url("hf", "ds")
    order = np.random.default_rng(0).permutation(len(texts)).tolist()[:300]
    for fault in ("503", "500", "reset", "truncate"):
        with S3Proxy(s3_endpoint.endpoint_url, plan=every(3, fault)) as proxy:
            src = ArrowSource(url, storage_options=through(proxy, s3_endpoint), attempts=6)
            assert len(src) == 4400 and src.read(order) == [texts[i] for i in order], fault
            assert src.file(0)._map is None, "read by range, not copied"
            assert proxy.injected[fault] > 0, f"the proxy injected no {fault}"
    assert main(["index", url, "--format", "arrow", "--storage-options", json.dumps(s3_endpoint.storage_options)]) == 0
    asked: list[str] = []
    with S3Proxy(s3_endpoint.endpoint_url, plan=lambda n, m, path, h: asked.append(f"{m} {path}")) as proxy:
        src = ArrowSource(url, storage_options=through(proxy, s3_endpoint))
        assert not src.files.listed and len(src) == 4400
        assert all(path.endswith(("state.json", manifest.MANIFEST)) for path in asked), asked  # no listing, no shard
        assert src.read(order) == [texts[i] for i in order]
    copied = ArrowSource(url, storage_options=s3_endpoint.storage_options, local_copy=True)
    assert copied.read(order) == [texts[i] for i in order] and copied.file(1)._map is not None, "a whole copy, memory-mapped"


# -- bad input: one line naming the file and the record --------------------------------------------
def test_bad_columns_are_refused_in_one_line_naming_the_file_and_the_column(tmp_path):
    save(tmp_path / "ints", texts_of(3), text=[1, 2, 3])
    shard = tmp_path / "ints" / "data-00000-of-00001.arrow"
    with pytest.raises(DataError) as e:
        ArrowSource(str(tmp_path / "ints"))
    assert str(e.value) == f"{shard}: column 'text' must be a string column, got int64"
    save(tmp_path / "ok", texts_of(3))
    wanted = r"data-00000-of-00001\.arrow: no column 'content' \(columns: text, n\); set text_field to the field"
    with pytest.raises(DataError, match=wanted + " or column that holds the text$"):
        ArrowSource(str(tmp_path / "ok"), "content")
    save(tmp_path / "nulls", texts_of(3), text=["a", None, "c"])
    src = ArrowSource(str(tmp_path / "nulls"))
    with pytest.raises(DataError, match=r"data-00000-of-00001\.arrow: record 1 \(record batch 0\): field 'text' is null$"):
        src.read([0, 1])
    table = pa.table({"text": ["x", "y", "z"], "tag": pa.array(["a", "b", "a"]).dictionary_encode()})
    with pytest.raises(DataError, match=r"dict\.arrow: byte \d+: dictionary-encoded columns are not supported"):
        ArrowSource(str(ipc(tmp_path / "dict.arrow", table, file_format=False, rows=2)))


def test_a_truncated_or_corrupt_file_is_refused_naming_the_file_and_the_record_batch(tmp_path):
    texts = texts_of(60)
    save(tmp_path / "ds", texts, batch=10)
    shard = tmp_path / "ds" / "data-00000-of-00001.arrow"
    data = shard.read_bytes()
    cut = tmp_path / "cut.arrow"
    cut.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(DataError) as e:
        ArrowSource(str(cut))
    msg = str(e.value)
    assert msg.startswith(f"{cut}: byte ") and "\n" not in msg
    assert "record batch 3 (after 30 records): not a readable Arrow IPC message" in msg
    junk = tmp_path / "junk.arrow"
    junk.write_bytes(b"not arrow at all" * 8)
    with pytest.raises(DataError, match=r"junk\.arrow: byte 0, the schema: not a readable Arrow IPC message"):
        ArrowSource(str(junk))
    bad = bytearray(data)
    at = bytes(bad).index(texts[47].encode())
    bad[at : at + 2] = b"\xff\xfe"  # invalid UTF-8 inside record 47's text
    broken = tmp_path / "broken.arrow"
    broken.write_bytes(bytes(bad))
    src = ArrowSource(str(broken))
    assert src.read([0, 39]) == [texts[0], texts[39]], "other batches still read"
    with pytest.raises(DataError) as e:
        src.read([47])
    assert str(e.value).startswith(f"{broken}: record batch 4 (records 40-49): cannot read column 'text'")
    assert "\n" not in str(e.value)
    filed = ipc(tmp_path / "f.arrow", pa.table({"text": texts}), file_format=True, rows=10)
    short = tmp_path / "short.arrow"
    short.write_bytes(filed.read_bytes()[:-5])
    with pytest.raises(DataError, match=r"short\.arrow: an Arrow IPC file without its footer"):
        ArrowSource(str(short))


# -- recipes, the Hub --------------------------------------------------------------------------------
def test_a_recipe_reads_a_split_with_format_arrow(tmp_path):
    texts = texts_of(50)
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"body": texts})})
    dd.save_to_disk(str(tmp_path / "dd"), num_shards={"train": 2})
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[sources]]\npath = "dd/train"\nformat = "arrow"\ntext_field = "body"\n')
    r = load_recipe(recipe)
    (src,) = r.sources()
    assert isinstance(src, ArrowSource) and all_docs(src) == texts
    batch = next(iter(r.build(seq_len=16, batch_size=2, tokenizer=CharTokenizer(), eos_id=0, prefetch=0)))
    assert len(batch.provenance) == 2


@pytest.mark.parametrize("path, cls", [
    ("hf://datasets/HuggingFaceFW/fineweb-edu/sample/10BT/*.parquet", ParquetSource),
    ("hf://datasets/org/name@main/data/train-00000-of-00002.parquet", ParquetSource),
    ("hf://datasets/org/name/train/*.arrow", ArrowSource), ("ds/train/data-00000-of-00001.arrow", ArrowSource),
])
def test_hub_paths_are_routed_by_suffix(path, cls):
    assert guess_format(path, "pass --format") is cls


def test_hf_urls_read_through_fsspec_as_a_remote_store(tmp_path, monkeypatch):
    """``hf://`` is huggingface_hub's fsspec filesystem; here it is a local folder behind the same protocol
    (nothing is fetched), so the sources take the object-store path: listing, range reads, no memory map."""
    from fsspec.implementations.dirfs import DirFileSystem
    from huggingface_hub import HfFileSystem

    assert fsspec.get_filesystem_class("hf") is HfFileSystem
    repo = tmp_path / "hub" / "datasets" / "org" / "name"
    texts = texts_of(80)
    save(repo / "train", texts, shards=2, batch=8)
    (repo / "pq").mkdir()
    pq.write_table(pa.table({"text": texts[:30]}), repo / "pq" / "train-00000-of-00001.parquet")

    class LocalHub(DirFileSystem):
        protocol = "hf"

        def __init__(self, **kwargs):
            super().__init__(path=str(tmp_path / "hub"), fs=fsspec.filesystem("file"))

        def _named(self, info: dict) -> dict:  # DirFileSystem's listings keep the inner names: give the repo's, as HfFileSystem does
            return {**info, "name": self._relpath(info["name"])}

        def glob(self, path, **kwargs):
            found = super().glob(path, **kwargs)
            return {p: self._named(i) for p, i in found.items()} if kwargs.get("detail") else found

        def walk(self, path, *args, **kwargs):
            for root, dirs, files in super().walk(path, *args, **kwargs):
                yield root, dirs, {n: self._named(i) for n, i in files.items()} if isinstance(files, dict) else files

    monkeypatch.setitem(importlib.import_module("fsspec.registry")._registry, "hf", LocalHub)  # the protocol's class, nothing else
    for path in ("hf://datasets/org/name/train", "hf://datasets/org/name/train/*.arrow"):
        src = ArrowSource(path)
        assert all_docs(src) == texts and src.file(0)._map is None and src.files.url(src.files.files[0]).startswith("hf://datasets/org/name/")
    assert all_docs(ParquetSource("hf://datasets/org/name/pq/*.parquet")) == texts[:30]
