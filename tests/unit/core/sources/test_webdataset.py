"""WebDataset tar shards (sources/webdataset.py), written by the ``webdataset`` package itself: the documents
are the text members ``webdataset.WebDataset`` yields, in its order; a restore is a seek; every document of an
epoch is delivered exactly once across resizes and restores; ``zephon index`` makes start-up open no shard;
on S3 the documents survive the fault proxy; bad input is one line naming the shard and the sample."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
import webdataset as wds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.core_fixtures import CharTokenizer, epoch_exactly_once, zephon_cache_dir  # noqa: F401  (autouse: a private index cache per test)

from zephon_core import ConfigError, DataError, Pipeline, StaticMixture, WebDatasetSource
from zephon_core.cli import main
from zephon_core.io.files import Access
from zephon_core.sources import manifest
from zephon_core.sources.registry import guess_format
from zephon_core.sources.webdataset import WebDatasetFile, member_of
from zephon_dev.s3_proxy import S3Proxy, every


def text_of(k: int, j: int) -> str:
    """Sample j of shard k: non-ASCII, several lines, now and then empty."""
    return "" if (k + j) % 11 == 5 else f"shard {k} sample {j}: é ü 中\n" + "w" * (j % 7)


def write_shards(folder: Path, counts: list[int], *, suffix: str = ".tar", start: int = 0, big: int = 0) -> list[str]:
    """Shards ``part-000<suffix>``, ... written by ``webdataset.TarWriter``: ``counts[k]`` samples each, every one with
    ``.cls``, ``.json`` and ``.txt`` members (``big``: that many bytes of text more per sample)."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = []
    for k, n in enumerate(counts, start):
        with wds.TarWriter(str(folder / f"part-{k:03d}{suffix}")) as w:
            for j in range(n):
                text = text_of(k, j) + "b" * big
                w.write({"__key__": f"k{k:03d}/{j:06d}", "txt": text, "json": {"shard": k, "j": j}, "cls": j % 3})
                texts.append(text)
    return texts


def shards(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.iterdir() if p.name.endswith((".tar", ".tar.gz", ".tgz")))


def all_docs(src) -> list:
    return src.read(list(range(len(src))))


# -- what a document is ----------------------------------------------------------------------
def test_documents_are_the_text_members_webdataset_yields_in_its_order(tmp_path):
    write_shards(tmp_path / "d", [4, 0, 3])
    write_shards(tmp_path / "d", [5], suffix=".tar.gz", start=3)
    write_shards(tmp_path / "d", [2], suffix=".tgz", start=4)
    urls = shards(tmp_path / "d")
    theirs = list(wds.WebDataset(urls, shardshuffle=False))
    src = WebDatasetSource(str(tmp_path / "d"))
    assert len(src.metas) == 5 and len(src) == len(theirs) == 14
    assert all_docs(src) == [s["txt"].decode("utf-8") for s in theirs]
    assert src.read([13, 0, 7]) == [theirs[13]["txt"].decode(), theirs[0]["txt"].decode(), theirs[7]["txt"].decode()]
    as_json = WebDatasetSource(str(tmp_path / "d"), text_field="json")  # any member, named by its extension
    assert all_docs(as_json) == [s["json"].decode("utf-8") for s in theirs]
    assert as_json.fingerprint() != src.fingerprint() and as_json.fingerprint()["member"] == "json"
    assert src.byte_lengths().tolist() == [len(s["txt"]) for s in theirs]


def test_keys_follow_webdatasets_convention_for_dots_long_names_and_tar_dialects(tmp_path):
    """A key ends at the first dot of the base name; ustar prefixes, GNU long names and pax paths are all read."""
    long_key = "deep/" + "d" * 120 + "/sample"
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        path = tmp_path / f"f{fmt}.tar"
        with tarfile.open(path, "w", format=fmt) as tar:
            for name, body in [("dir.v1/a.en.txt", b"English"), ("dir.v1/a.TXT", "Tä".encode()), ("dir.v1/a.json", b"{}"),
                               ("__meta__", b"skipped"), ("README", b"no extension"), (f"{long_key}.en.txt", b"long en"),
                               (f"{long_key}.txt", b"long")]:
                info = tarfile.TarInfo(name)
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
            folder = tarfile.TarInfo("a-folder")
            folder.type = tarfile.DIRTYPE
            tar.addfile(folder)  # a folder: no member of a sample
        theirs = list(wds.WebDataset([str(path)], shardshuffle=False))
        assert [s["__key__"] for s in theirs] == ["dir.v1/a", long_key]
        assert all_docs(WebDatasetSource(str(path))) == [s["txt"].decode() for s in theirs] == ["Tä", "long"]
        assert all_docs(WebDatasetSource(str(path), text_field="en.txt")) == ["English", "long en"]
    assert [member_of(f) for f in ("text", "txt", ".TXT", ".text", "en.txt")] == ["txt", "txt", "txt", "text", "en.txt"]


def test_one_shard_keeps_the_single_file_fingerprint_and_a_moved_corpus_keeps_its_own(tmp_path):
    write_shards(tmp_path / "a", [3, 2])
    one = WebDatasetSource(str(tmp_path / "a" / "part-000.tar"))
    assert set(one.fingerprint()) == {"kind", "member", "size", "sample_blake2b"} and one.fingerprint()["kind"] == "webdataset"
    os.rename(tmp_path / "a", tmp_path / "b")
    moved = WebDatasetSource(str(tmp_path / "b"))
    assert moved.fingerprint()["files"] == 2 and moved.fingerprint() == WebDatasetSource(str(tmp_path / "b" / "*.tar")).fingerprint()


def test_the_format_is_guessed_from_tar_suffixes_and_named_in_recipes(tmp_path):
    from zephon_core.recipe import load_recipe

    for path in ("x/*.tar", "x/a.tar.gz", "x/a.tgz", "s3://b/shards/part-0001.tar"):
        assert guess_format(path, "pass --format") is WebDatasetSource
    texts = write_shards(tmp_path / "shards", [3, 4])
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[sources]]\npath = "shards"\nformat = "webdataset"\nname = "web"\n')
    r = load_recipe(recipe)
    (src,) = r.sources()
    assert isinstance(src, WebDatasetSource) and src.name == "web" and all_docs(src) == texts and not r.pretokenized
    batch = next(iter(r.build(seq_len=8, batch_size=2, tokenizer=CharTokenizer())))
    assert batch.input_ids.shape == (2, 8)
    recipe.write_text('[[sources]]\npath = "shards"\nformat = "webdataset"\ntext_field = "json"\n')
    assert json.loads(load_recipe(recipe).sources()[0].read([4])[0]) == {"shard": 1, "j": 1}
    recipe.write_text('[[sources]]\npath = "shards"\nformat = "webdataset"\noffsets = "o.npy"\n')
    with pytest.raises(Exception, match=r"sources\[0\]\.offsets: a webdataset source takes no offsets"):
        load_recipe(recipe)


# -- restore, exactly once, manifests ----------------------------------------------------------
def test_a_restore_is_a_seek_that_reads_only_what_it_delivers(tmp_path, monkeypatch):
    write_shards(tmp_path / "d", [40, 35, 50])

    def pipeline() -> Pipeline:
        ws = StaticMixture([WebDatasetSource(str(tmp_path / "d"))], seed=4, chunk_size=4)
        return Pipeline(ws).tokenize(CharTokenizer(), eos_id=0).pack(32).batch(2).options(prefetch=0)

    reference = pipeline()
    it = iter(reference)
    for _ in range(20):
        next(it)
    state = reference.checkpoint()
    expected = [next(it).digest for _ in range(3)]
    reads: list[int] = []
    original = WebDatasetFile.read
    monkeypatch.setattr(WebDatasetFile, "read", lambda self, idx: reads.append(len(idx)) or original(self, idx))
    resumed = pipeline()
    resumed.restore(state)
    again = iter(resumed)
    assert [next(again).digest for _ in range(3)] == expected
    assert sum(reads) <= 20, f"a restore read {sum(reads)} documents to deliver 3 batches (a replay of 20 batches reads 56)"


def _shard_layout(folder: Path, counts: list[int]) -> list[str]:
    texts = []
    for k, n in enumerate(counts):
        texts += write_shards(folder, [n], suffix=(".tar", ".tar.gz", ".tgz")[k % 3], start=k)
    return texts


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 6), min_size=1, max_size=5).filter(lambda c: sum(c) > 0), st.sampled_from([None, 2, 3]),
       st.sampled_from([(1, 2), (2, 4), (4, 1)]), st.integers(0, 3))
def test_every_document_of_an_epoch_is_delivered_exactly_once_across_shards_resizes_and_restores(tmp_path_factory, counts, block, topo, first):
    folder = tmp_path_factory.mktemp("wds")
    texts = _shard_layout(folder, counts)
    docs = epoch_exactly_once(lambda: WebDatasetSource(str(folder)), CharTokenizer(), block=block, G1=topo[0], G2=topo[1], first=first)
    assert docs == texts


def test_zephon_index_writes_a_manifest_that_start_up_uses_without_opening_a_shard(tmp_path, monkeypatch, capsys, zephon_cache_dir):  # noqa: F811
    texts = write_shards(tmp_path / "d", [3, 0, 4], suffix=".tar.gz") + write_shards(tmp_path / "d", [2], start=3)
    assert main(["index", str(tmp_path / "d"), "--format", "webdataset"]) == 0
    assert "4 files, 9 documents" in capsys.readouterr().out
    assert (tmp_path / "d" / manifest.MANIFEST).exists() and len(list((tmp_path / "d" / manifest.INDEX_DIR).glob("*.npz"))) == 4
    copies = list((zephon_cache_dir / "shards").glob("*.bin"))
    assert len(copies) == 3, "zephon index decompressed the .tar.gz shards into the shard cache"
    for p in copies:
        p.unlink()  # a fresh node has none
    opened: list[str] = []
    original = WebDatasetFile.__init__
    monkeypatch.setattr(WebDatasetFile, "__init__", lambda self, *a, **k: opened.append(a[0]) or original(self, *a, **k))
    src = WebDatasetSource(str(tmp_path / "d"))
    assert opened == [] and len(src) == 9 and not list((zephon_cache_dir / "shards").glob("*.bin")), "start-up opens no shard"
    assert src.read([8, 3]) == [texts[8], texts[3]] and len(opened) == 2  # only the shards read
    assert src.fingerprint() == WebDatasetSource(str(tmp_path / "d"), access=Access(manifest=False)).fingerprint()
    with pytest.raises(DataError, match="built for a webdataset source with {'member': 'txt'}.*with {'member': 'json'}"):
        WebDatasetSource(str(tmp_path / "d"), text_field="json")
    write_shards(tmp_path / "d", [1], start=9)
    with pytest.raises(DataError, match=r"stale: file part-009\.tar is not in the manifest"):
        WebDatasetSource(str(tmp_path / "d"))


# -- on S3, through the fault proxy ---------------------------------------------------------
NO_CLIENT_RETRIES = {"config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}}}


def through(proxy: S3Proxy, ep) -> dict:
    so = proxy.endpoint(ep.bucket).storage_options
    so.update(NO_CLIENT_RETRIES, skip_instance_cache=True)
    return so


def upload(ep, local: Path, prefix: str) -> None:
    fs = ep.filesystem()
    for p in shards(local):
        fs.put_file(p, f"{ep.bucket}/{prefix}/{Path(p).name}")


def test_shards_on_s3_read_like_local_disk_through_injected_faults(s3_endpoint, tmp_path):
    texts = write_shards(tmp_path / "d", [30, 25])
    texts += write_shards(tmp_path / "d", [10], start=2, big=230_000)  # ~2.3 MB: read by ranges, not whole
    texts += write_shards(tmp_path / "d", [20], suffix=".tar.gz", start=3)
    upload(s3_endpoint, tmp_path / "d", "wds-faults")
    for fault in ("503", "500", "reset", "truncate"):
        with S3Proxy(s3_endpoint.endpoint_url, plan=every(3, fault)) as proxy:
            src = WebDatasetSource(s3_endpoint.url("wds-faults"), storage_options=through(proxy, s3_endpoint),
                                   access=Access(attempts=6, cache_dir=str(tmp_path / fault)))
            assert all_docs(src) == texts, fault
            assert proxy.injected[fault] > 0, f"the proxy injected no {fault}"


def test_a_manifest_on_s3_is_the_one_request_at_start_up(s3_endpoint, tmp_path):
    texts = write_shards(tmp_path / "d", [4, 3, 5]) + write_shards(tmp_path / "d", [2], suffix=".tar.gz", start=3)
    upload(s3_endpoint, tmp_path / "d", "wds-man")
    so = json.dumps(s3_endpoint.storage_options)
    assert main(["index", s3_endpoint.url("wds-man"), "--format", "webdataset", "--storage-options", so]) == 0
    asked: list[tuple[str, str]] = []
    with S3Proxy(s3_endpoint.endpoint_url, plan=lambda n, m, path, h: asked.append((m, path))) as proxy:
        src = WebDatasetSource(s3_endpoint.url("wds-man"), storage_options=through(proxy, s3_endpoint))
        assert len(src) == 14 and not src.files.listed
        assert asked == [("GET", "/zephon-test/wds-man/zephon-manifest.json")], asked
        assert all_docs(src) == texts
    fs = s3_endpoint.filesystem()
    with wds.TarWriter(f"{tmp_path}/new.tar") as w:
        w.write({"__key__": "x", "txt": "rewritten"})
    fs.put_file(f"{tmp_path}/new.tar", f"{s3_endpoint.bucket}/wds-man/part-001.tar")
    stale = WebDatasetSource(s3_endpoint.url("wds-man"), storage_options=s3_endpoint.storage_options)
    assert stale.read([0]) == texts[:1]
    with pytest.raises(DataError, match=r"part-001\.tar: stale: the object changed"):
        stale.read([5])


# -- bad input: one line naming the shard and the sample --------------------------------------
def one_line(path: Path, match: str, **kw) -> str:
    with pytest.raises(DataError) as e:
        all_docs(WebDatasetSource(str(path), **kw))
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg, msg
    assert __import__("re").search(match, msg), msg
    return msg


def test_bad_shards_are_refused_in_one_line_naming_the_shard_and_the_sample(tmp_path):
    def tar(name: str, samples: list[dict]) -> Path:
        with wds.TarWriter(str(tmp_path / name)) as w:
            for s in samples:
                w.write(s)
        return tmp_path / name

    one_line(tar("missing.tar", [{"__key__": "a", "txt": "ok"}, {"__key__": "b", "json": {}, "cls": 1}]),
             r"sample 'b' has no \.txt member \(its members: \.cls, \.json\)")
    one_line(tar("latin1.tar", [{"__key__": "a", "txt": "ok"}, {"__key__": "b", "txt": "café".encode("latin-1")}]),
             r"sample 'b': member \.txt is not valid UTF-8 \(byte 3 of it\)")
    one_line(tar("again.tar", [{"__key__": "a", "txt": "1"}, {"__key__": "b", "txt": "2"}, {"__key__": "a", "json": {}}]),
             r"sample 'a' appears again at member 'a\.json', after other samples")
    one_line(tar("twice.tar", [{"__key__": "a", "txt": "1"}, {"__key__": "a", "txt": "2"}]), r"sample 'a' has two \.txt members")
    whole = tar("whole.tar", [{"__key__": f"s{j}", "txt": "x" * 700} for j in range(4)]).read_bytes()
    second = tarfile.open(tmp_path / "whole.tar").getmembers()[1]
    (tmp_path / "cut.tar").write_bytes(whole[: second.offset_data + 100])
    one_line(tmp_path / "cut.tar", rf"truncated tar: member 's1\.txt' at byte \d+ has 700 bytes of data, the file ends at byte {second.offset_data + 100}")
    end = whole.rstrip(b"\0")
    (tmp_path / "boundary.tar").write_bytes(end + bytes(-len(end) % 512))
    one_line(tmp_path / "boundary.tar", r"truncated tar: it ends without the end-of-archive blocks at byte \d+")
    (tmp_path / "cat.tar").write_bytes(whole + whole)
    one_line(tmp_path / "cat.tar", r"data follows the tar's end-of-archive marker at byte \d+: the shard holds more than one archive")
    damaged = bytearray(whole)
    damaged[second.offset + 10] ^= 0x55  # inside the second member's (first) header
    (tmp_path / "flipped.tar").write_bytes(bytes(damaged))
    one_line(tmp_path / "flipped.tar", rf"damaged tar: a header that fails its checksum at byte {second.offset}")
    (tmp_path / "bad.tar.gz").write_bytes(gzip.compress(b"not a tar at all, but gzip"))
    one_line(tmp_path / "bad.tar.gz", r"not a tar: 26 bytes, less than one tar header")
    (tmp_path / "bad.tgz").write_bytes(b"not gzip")
    one_line(tmp_path / "bad.tgz", r"cannot decompress \(gzip\)")


def test_a_bad_sample_in_a_many_shard_source_names_its_shard_and_never_is_skipped(tmp_path):
    write_shards(tmp_path / "d", [3, 3])
    with wds.TarWriter(str(tmp_path / "d" / "part-001.tar")) as w:
        w.write({"__key__": "k001/000000", "txt": "fine"})
        w.write({"__key__": "k001/000001", "txt": b"\xff\xfe"})
    with pytest.raises(DataError, match=r"part-001\.tar: sample 'k001/000001': member \.txt is not valid UTF-8"):
        WebDatasetSource(str(tmp_path / "d"))
    with pytest.raises(ConfigError, match=r"sources\[0\]\.text_field: names no member"):
        from zephon_core.recipe import load_recipe

        (tmp_path / "r.toml").write_text('[[sources]]\npath = "d"\nformat = "webdataset"\ntext_field = "."\n')
        load_recipe(tmp_path / "r.toml")


def test_text_read_by_an_index_built_elsewhere_is_still_checked_and_named(tmp_path):
    import numpy as np

    with wds.TarWriter(str(tmp_path / "s.tar")) as w:
        w.write({"__key__": "a", "txt": "ok", "bin": b"\xffa"})
        w.write({"__key__": "b", "txt": "fine", "bin": b"\xfeb"})
    bins = [m for m in tarfile.open(tmp_path / "s.tar").getmembers() if m.name.endswith(".bin")]
    index = {"starts": np.array([m.offset_data for m in bins], dtype=np.int64), "lengths": np.array([m.size for m in bins], dtype=np.int64)}
    wrong = WebDatasetFile(str(tmp_path / "s.tar"), index=index)  # as a manifest of other bytes would say
    with pytest.raises(DataError, match=r"s\.tar: sample 'b': member \.txt is not valid UTF-8 \(byte 0 of it\)"):
        wrong.read([1])
    index["starts"][1] += 1  # not block-aligned: not this tar's index, so the tar is walked again
    assert WebDatasetFile(str(tmp_path / "s.tar"), index=index).read([1, 0]) == ["fine", "ok"]
