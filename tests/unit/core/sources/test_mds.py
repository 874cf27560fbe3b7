"""MosaicML Streaming MDS datasets as sources (sources/mds.py): written by ``streaming.MDSWriter``, read as
Streaming reads them, started from index.json alone (locally and on S3, through injected faults), and
every bad shard refused in one line naming the file, the shard and the sample."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.core_fixtures import CharTokenizer, epoch_exactly_once, text_docs, token_docs, zephon_cache_dir  # noqa: F401  (autouse)

from zephon_core import ConfigError, DataError, MdsSource, MdsTokensSource, Pipeline, StaticMixture
from zephon_core.sources.mds_shard import MdsShard
from zephon_dev.s3_proxy import S3Proxy, every, through

COLUMNS = {"text": "str", "tokens": "ndarray:int32", "flex": "ndarray", "fixed": "ndarray:uint16:3", "id": "int"}


def rows(n: int, source: int = 0) -> list[dict]:
    """Samples whose every column names where they came from (text, three kinds of token column, an int)."""
    texts, tokens = text_docs(n, source), token_docs(n, source)
    return [{"text": t, "tokens": np.asarray(k, dtype=np.int32), "flex": np.arange(1 + d % 5, dtype=np.int64 if d % 2 else np.uint8),
             "fixed": np.array([d, d + 1, d + 2], dtype=np.uint16), "id": d} for d, (t, k) in enumerate(zip(texts, tokens))]


def write_mds(folder: Path, samples: list[dict], *, columns: dict[str, str] | None = None, compression: str | None = None,
              size_limit: int = 700, hashes: list[str] | None = None) -> Path:
    from streaming import MDSWriter

    with MDSWriter(out=str(folder), columns=columns or COLUMNS, compression=compression, size_limit=size_limit, hashes=hashes) as w:
        for s in samples:
            w.write(s)
    return folder


def index_of(folder: Path) -> dict:
    return json.loads((folder / "index.json").read_text())


def streaming_rows(folder: Path, tmp: Path) -> list[dict]:
    """What Streaming's own reader yields for the dataset, in its order (shuffle off), from a copy it may decompress into."""
    from streaming import StreamingDataset

    peer = tmp / f"peer-{folder.name}"
    shutil.copytree(folder, peer)
    ds = StreamingDataset(local=str(peer), shuffle=False, batch_size=1)
    return [ds[i] for i in range(len(ds))]


def all_docs(src) -> list:
    return src.read(list(range(len(src))))


# -- what a document is ------------------------------------------------------------------------
@pytest.mark.parametrize("compression", [None, "zstd:7"])
def test_text_and_token_columns_are_what_streaming_reads_in_its_order(tmp_path, compression):
    folder = write_mds(tmp_path / "ds", rows(120), compression=compression, hashes=["sha1", "xxh64"])
    assert len(index_of(folder)["shards"]) > 5, "several shards"
    peer = streaming_rows(folder, tmp_path)
    text = MdsSource(str(folder))
    assert all_docs(text) == [r["text"] for r in peer] == text_docs(120)
    for column in ("tokens", "flex", "fixed"):
        tokens = MdsTokensSource(str(folder), column)
        assert [d.tolist() for d in all_docs(tokens)] == [r[column].tolist() for r in peer], column
    tokens = MdsTokensSource(str(folder))  # the column "tokens" by default
    order = [77, 3, 3, 119, 0, 56, 57, 58]
    assert [d.tolist() for d in tokens.read(order)] == [token_docs(120)[i] for i in order]
    flat, lengths = tokens.read_flat(np.array(order), headroom=2)
    assert flat[2:].tolist() == [t for i in order for t in token_docs(120)[i]] and lengths.tolist() == [len(token_docs(120)[i]) for i in order]
    assert text.read(order) == [text_docs(120)[i] for i in order]


@pytest.mark.parametrize("compression", ["gz:5", "bz2", "br:3", "snappy"])
def test_every_compression_streaming_writes_reads_as_the_plain_shards(tmp_path, compression, zephon_cache_dir):  # noqa: F811
    folder = write_mds(tmp_path / "ds", rows(60), compression=compression, hashes=["md5"])
    assert all_docs(MdsSource(str(folder))) == text_docs(60)
    assert list((zephon_cache_dir / "shards").glob("*.bin")), "decompressed once, into the shard cache"


def test_a_folder_streaming_decompressed_into_reads_its_raw_shards(tmp_path):
    folder = write_mds(tmp_path / "ds", rows(40), compression="zstd")
    streaming_rows(folder, tmp_path)  # Streaming's copy now holds shard.*.mds beside shard.*.mds.zstd
    peer = tmp_path / "peer-ds"
    assert list(peer.glob("*.mds")) and list(peer.glob("*.mds.zstd"))
    assert all_docs(MdsSource(str(peer))) == text_docs(40)
    assert MdsSource(str(peer)).fingerprint() == MdsSource(str(folder)).fingerprint()


# -- start-up, streams, fingerprints ----------------------------------------------------------
def test_start_up_reads_index_json_alone_and_a_read_opens_only_its_shard(tmp_path, monkeypatch):
    folder = write_mds(tmp_path / "ds", rows(90))
    opened: list[int] = []
    original = MdsShard.__init__
    monkeypatch.setattr(MdsShard, "__init__",
                        lambda self, spec, *a, **k: opened.append(spec.number) or original(self, spec, *a, **k))
    src = MdsSource(str(folder))
    assert opened == [] and len(src) == 90 and len(src.metas) == len(index_of(folder)["shards"])
    last = len(src.metas) - 1
    assert src.read([89]) == [text_docs(90)[89]] and opened == [last]
    assert MdsSource(str(folder / "index.json")).fingerprint() == src.fingerprint()


def test_a_folder_of_streams_a_list_and_a_merged_index_are_one_source_in_sorted_order(tmp_path):
    from streaming.base.util import merge_index

    root = tmp_path / "streams"
    write_mds(root / "b-code", rows(30, source=1))
    write_mds(root / "a-web", rows(20, source=0), compression="zstd")
    expected = text_docs(20, 0) + text_docs(30, 1)
    by_folder = MdsSource(str(root))
    by_list = MdsSource([str(root / "b-code"), str(root / "a-web" / "index.json")])
    assert all_docs(by_folder) == all_docs(by_list) == expected
    assert by_folder.fingerprint() == by_list.fingerprint()
    merge_index([str(root / "a-web" / "index.json"), str(root / "b-code" / "index.json")], str(root), keep_local=True)
    merged = MdsSource(str(root))  # the root's own index.json now lists every shard ("a-web/shard.00000.mds.zstd", ...)
    assert all_docs(merged) == expected and merged.fingerprint() == by_folder.fingerprint()
    (root / "index.json").unlink()
    (root / "c-unfinished").mkdir()
    with pytest.raises(DataError, match=r"c-unfinished: a sub-folder of the MDS streams .* without an index\.json"):
        MdsSource(str(root))


def test_the_fingerprint_names_the_content_and_the_column_never_the_path(tmp_path):
    folder = write_mds(tmp_path / "ds", rows(50), hashes=["sha1"])
    src = MdsSource(str(folder))
    shutil.copytree(folder, tmp_path / "moved")
    assert MdsSource(str(tmp_path / "moved")).fingerprint() == src.fingerprint()
    fp = src.fingerprint()
    assert fp["kind"] == "mds" and fp["column"] == "text" and fp["encoding"] == "str" and fp["documents"] == 50
    assert str(tmp_path) not in json.dumps(fp)
    changed = rows(50)
    changed[33]["text"] = "edited"
    assert MdsSource(str(write_mds(tmp_path / "edited", changed, hashes=["sha1"]))).fingerprint() != fp
    assert MdsTokensSource(str(folder)).fingerprint()["kind"] == "mds_tokens"


# -- the data contract -------------------------------------------------------------------------
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 60), st.sampled_from([300, 700, 2000]), st.sampled_from([None, "zstd"]), st.booleans(), st.sampled_from([None, 3]))
def test_every_document_of_an_epoch_is_delivered_exactly_once_across_shards_resizes_and_restores(tmp_path_factory, n, size_limit,
                                                                                                 compression, tokens, block):
    folder = write_mds(tmp_path_factory.mktemp("mds") / "ds", rows(n), compression=compression, size_limit=size_limit)
    if tokens:
        docs = epoch_exactly_once(lambda: MdsTokensSource(str(folder)), None, block=block)
        assert [d.tolist() for d in docs] == token_docs(n)
    else:
        assert epoch_exactly_once(lambda: MdsSource(str(folder)), CharTokenizer(), block=block) == text_docs(n)


def test_a_restore_is_a_seek_that_opens_only_the_shards_it_reads(tmp_path, monkeypatch):
    folder = write_mds(tmp_path / "ds", rows(600), size_limit=1500)

    def pipeline() -> Pipeline:
        ws = StaticMixture([MdsSource(str(folder))], seed=4, chunk_size=8, shuffle=False)
        return Pipeline(ws).tokenize(CharTokenizer()).pack(32).batch(2).options(prefetch=0, reader_threads=0)

    p = pipeline()
    it = iter(p)
    for _ in range(40):
        next(it)
    state = p.checkpoint()
    expected = [next(it) for _ in range(3)]
    opened: list[int] = []
    original = MdsShard.__init__
    monkeypatch.setattr(MdsShard, "__init__",
                        lambda self, spec, *a, **k: opened.append(spec.number) or original(self, spec, *a, **k))
    q = pipeline()
    q.restore(state)
    got = [b for b, _ in zip(q, range(3))]
    assert [b.digest for b in got] == [b.digest for b in expected]
    read = {int(np.searchsorted(q_src_starts(folder), s.document, side="right") - 1) for b in got for row in b.provenance for s in row}
    shards = len(index_of(folder)["shards"])
    assert opened and min(opened) == min(read) > 0, "no shard before the checkpoint's position is opened"
    assert len(set(opened)) < shards // 4, "nor most of the others: only those the next rows (and the reader's chunk) need"


def q_src_starts(folder: Path) -> np.ndarray:
    counts = [s["samples"] for s in index_of(folder)["shards"]]
    return np.concatenate([[0], np.cumsum(counts)])


def test_token_counts_come_from_the_offsets_where_the_layout_tells_them(tmp_path):
    from zephon_core.recipe import load_recipe

    lengths = [len(d) for d in token_docs(300, lo=1, hi=700)]  # shape headers of 1 and 2 bytes
    samples = [{"tokens": np.arange(n, dtype=np.int32), "id": d, "fixed": np.zeros(3, np.uint16)} for d, n in enumerate(lengths)]
    folder = write_mds(tmp_path / "ds", samples, columns={"tokens": "ndarray:int32", "id": "int", "fixed": "ndarray:uint16:3"}, size_limit=20_000)
    assert MdsTokensSource(str(folder)).token_lengths().tolist() == lengths
    assert MdsTokensSource(str(folder), "fixed").token_lengths().tolist() == [3] * 300
    mixed = write_mds(tmp_path / "mixed", rows(20))  # other variable-size columns: counting would read every sample
    assert MdsTokensSource(str(mixed)).token_lengths() is None and MdsSource(str(mixed)).token_lengths() is None
    recipe = tmp_path / "r.toml"
    recipe.write_text('weight_by = "tokens"\n[[sources]]\npath = "ds"\nformat = "mds_tokens"\ntext_field = "tokens"\nname = "a"\n')
    assert next(iter(load_recipe(recipe).build(seq_len=8, batch_size=2))).input_ids.shape == (2, 8)


def test_recipes_read_mds_as_text_and_mds_tokens_as_tokens(tmp_path):
    from zephon_core.cli import main
    from zephon_core.recipe import load_recipe

    write_mds(tmp_path / "ds", rows(40))
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[sources]]\npath = "ds"\nformat = "mds"\n')
    text = load_recipe(recipe)
    assert not text.pretokenized and all_docs(text.sources()[0]) == text_docs(40)
    assert next(iter(text.build(seq_len=8, batch_size=2, tokenizer=CharTokenizer()))).input_ids.shape == (2, 8)
    recipe.write_text('[[sources]]\npath = "ds"\nformat = "mds_tokens"\ntext_field = "tokens"\n')
    tokens = load_recipe(recipe)
    assert tokens.pretokenized and [d.tolist() for d in all_docs(tokens.sources()[0])] == token_docs(40)
    assert next(iter(tokens.build(seq_len=8, batch_size=2))).input_ids.shape == (2, 8)
    recipe.write_text('[[sources]]\npath = "ds"\nformat = "mds"\n[[sources]]\npath = "ds"\nformat = "mds_tokens"\n')
    with pytest.raises(ConfigError, match="mixes text and pretokenized sources"):
        load_recipe(recipe)
    assert main(["index", str(tmp_path / "ds" / "index.json")]) == 1  # index.json is the manifest: zephon index writes none


# -- object stores -------------------------------------------------------------------------------
def upload(ep, folder: Path, prefix: str) -> None:
    fs = ep.filesystem()
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            fs.pipe_file(f"{ep.bucket}/{prefix}/{f.relative_to(folder).as_posix()}", f.read_bytes())


def test_on_s3_a_dataset_reads_like_local_disk_through_injected_faults(s3_endpoint, tmp_path):
    write_mds(tmp_path / "plain", rows(60), size_limit=4000)
    write_mds(tmp_path / "zstd", rows(60, source=1), compression="zstd", hashes=["xxh64"], size_limit=4000)
    upload(s3_endpoint, tmp_path / "plain", "mds-faults/plain")
    upload(s3_endpoint, tmp_path / "zstd", "mds-faults/zstd")
    expected = text_docs(60, 0) + text_docs(60, 1)
    for fault in ("503", "500", "reset", "truncate"):
        with S3Proxy(s3_endpoint.endpoint_url, plan=every(3, fault)) as proxy:
            # Every third GET fails, index.json's first among them; a cache folder per round: the zstd shards come through the faults.
            src = MdsSource(s3_endpoint.url("mds-faults"), storage_options=through(proxy, s3_endpoint), attempts=6, cache_dir=str(tmp_path / fault))
            assert all_docs(src) == expected, fault
            assert proxy.injected[fault] > 0, f"the proxy injected no {fault}"


def test_on_s3_start_up_at_ten_thousand_shards_is_one_get_of_index_json(s3_endpoint, tmp_path):
    from streaming import MDSWriter

    with MDSWriter(out=str(tmp_path / "big"), columns={"text": "str"}, size_limit=120) as w:
        for d in range(10_000):
            w.write({"text": f"document {d}"})
    fs = s3_endpoint.filesystem()
    last = index_of(tmp_path / "big")["shards"][-1]["raw_data"]["basename"]
    for name in ("index.json", last):  # start-up needs index.json alone; the read below one shard
        fs.pipe_file(f"{s3_endpoint.bucket}/mds10k/{name}", (tmp_path / "big" / name).read_bytes())
    asked: list[tuple[str, str]] = []
    with S3Proxy(s3_endpoint.endpoint_url, plan=lambda n, m, path, h: asked.append((m, path))) as proxy:
        src = MdsSource(s3_endpoint.url("mds10k"), storage_options=through(proxy, s3_endpoint))
        assert len(src) == 10_000 and len(src.metas) >= 10_000
        assert asked == [("GET", "/zephon-test/mds10k/index.json")], asked
        assert src.read([9_999]) == ["document 9999"]
        assert [p for _, p in asked[1:]] == [f"/zephon-test/mds10k/{last}"], asked


def test_on_s3_a_missing_or_corrupt_shard_is_named(s3_endpoint, tmp_path):
    folder = write_mds(tmp_path / "ds", rows(40), compression="zstd", hashes=["sha1"])
    upload(s3_endpoint, folder, "mds-bad")
    fs = s3_endpoint.filesystem()
    fs.rm_file(f"{s3_endpoint.bucket}/mds-bad/shard.00001.mds.zstd")
    src = MdsSource(s3_endpoint.url("mds-bad"), storage_options=s3_endpoint.storage_options, attempts=2)
    first = index_of(folder)["shards"][0]["samples"]
    with pytest.raises(DataError, match=r"mds-bad/shard\.00001\.mds\.zstd \(shard 1 of s3://zephon-test/mds-bad/index\.json\): no such file"):
        src.read([first])
    body = index_of(folder)
    body["shards"][0]["raw_data"]["hashes"]["sha1"] = "0" * 40
    fs.pipe_file(f"{s3_endpoint.bucket}/mds-bad/index.json", json.dumps(body).encode())
    with pytest.raises(DataError, match=r"shard\.00000\.mds\.zstd \(shard 0 of .*\): its sha1 hash [0-9a-f]+ is not index\.json's 0{40}"):
        MdsSource(s3_endpoint.url("mds-bad"), storage_options=s3_endpoint.storage_options, cache_dir=str(tmp_path / "c")).read([0])


# -- bad input: one line naming the file, the shard and the sample ----------------------------------
def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def shard_file(folder: Path, k: int) -> Path:
    return folder / index_of(folder)["shards"][k]["raw_data"]["basename"]


def test_a_truncated_or_grown_shard_is_refused_naming_it_and_the_sample(tmp_path):
    folder = write_mds(tmp_path / "ds", rows(60))
    path = shard_file(folder, 2)
    data = path.read_bytes()
    n = index_of(folder)["shards"][2]["samples"]
    path.write_bytes(data[: len(data) - 10])
    src = MdsSource(str(folder))
    start = int(q_src_starts(folder)[2])
    with pytest.raises(DataError) as e:
        src.read([start])
    assert one_line(e).startswith(f"{path} (shard 2 of {folder / 'index.json'}): sample {n - 1}: its offsets")
    assert f"{len(data) - 10} bytes, index.json says {len(data)}" in str(e.value) and "truncated" in str(e.value)
    path.write_bytes(data + b"junk")
    with pytest.raises(DataError, match=rf"shard 2 of .*: {len(data) + 4} bytes, index.json says {len(data)}, its offsets end at byte {len(data)}"):
        MdsSource(str(folder)).read([start])


def test_a_sample_whose_offsets_are_out_of_range_is_refused_naming_it(tmp_path):
    folder = write_mds(tmp_path / "ds", rows(60))
    path = shard_file(folder, 1)
    data = bytearray(path.read_bytes())
    offsets = np.frombuffer(bytes(data[4 : 4 * 5]), np.uint32).copy()
    offsets[3] = len(data) + 1000  # sample 2 ends, and sample 3 starts, past the end of the file
    data[4 : 4 * 5] = offsets.tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(DataError) as e:
        MdsSource(str(folder)).read([int(q_src_starts(folder)[1])])
    assert one_line(e).startswith(f"{path} (shard 1 of {folder / 'index.json'}): sample 2: its offsets")
    offsets[3] = offsets[2] - 1  # now it runs backwards
    data[4 : 4 * 5] = offsets.tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"\(shard 1 of .*\): sample 2: its offsets run backwards"):
        MdsSource(str(folder)).read([int(q_src_starts(folder)[1])])


def test_a_sample_whose_column_sizes_are_corrupt_is_refused_naming_it(tmp_path):
    folder = write_mds(tmp_path / "ds", rows(30), columns={"text": "str", "tokens": "ndarray:int32"})
    path = shard_file(folder, 0)
    data = bytearray(path.read_bytes())
    n = index_of(folder)["shards"][0]["samples"]
    at = int(np.frombuffer(bytes(data[4 + 4 * 4 : 4 + 4 * 5]), np.uint32)[0])  # sample 4's first byte: the size of its first column
    data[at : at + 4] = np.uint32(10_000).tobytes()
    path.write_bytes(bytes(data))
    src = MdsSource(str(folder))
    assert src.read([3]) == [text_docs(30)[3]], "the other samples still read"
    with pytest.raises(DataError) as e:
        src.read([2, 4])
    assert one_line(e) == f"{path} (shard 0 of {folder / 'index.json'}): sample 4: its column sizes do not add up to its length: the shard is corrupt"
    assert n > 4
    at = int(np.frombuffer(bytes(data[4 + 4 * 2 : 4 + 4 * 3]), np.uint32)[0])  # sample 2: two sizes, then its text
    data[at + 8] = 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DataError) as e:
        MdsSource(str(folder)).read([2])
    assert one_line(e).endswith("(shard 0 of " + str(folder / "index.json") + "): sample 2: column 'text' is not valid UTF-8 (byte 0)")


def test_a_corrupt_compressed_shard_and_a_hash_mismatch_are_named(tmp_path):
    folder = write_mds(tmp_path / "ds", rows(40), compression="zstd", hashes=["sha1", "xxh64"])
    zipped = folder / index_of(folder)["shards"][1]["zip_data"]["basename"]
    zipped.write_bytes(zipped.read_bytes()[:-7])
    with pytest.raises(DataError) as e:
        MdsSource(str(folder)).read([int(q_src_starts(folder)[1])])
    assert one_line(e).startswith(f"{zipped}") and "(shard 1 of" in str(e.value)
    body = index_of(folder)
    body["shards"][0]["raw_data"]["hashes"]["xxh64"] = "0" * 16
    (folder / "index.json").write_text(json.dumps(body))
    with pytest.raises(DataError, match=r"\(shard 0 of .*\): its xxh64 hash [0-9a-f]+ is not index\.json's 0{16}: the shard is corrupt"):
        MdsSource(str(folder)).read([0])


def test_columns_that_are_not_text_or_tokens_are_refused_at_start_up(tmp_path):
    import pickle  # noqa: F401  (only to show what pkl columns hold; nothing is unpickled)

    folder = write_mds(tmp_path / "ds", [{**r, "meta": {"d": r["id"]}, "blob": r, "score": np.float32([0.5])} for r in rows(10)],
                       columns={**COLUMNS, "meta": "json", "blob": "pkl", "score": "ndarray:float32"})
    idx = f"{folder / 'index.json'}: shard 0"
    cases = [
        (MdsSource, "missing", rf"{idx}: no column 'missing' \(columns: blob \(pkl\), fixed .*\); set text_field to the column of the text"),
        (MdsSource, "blob", rf"{idx}: column 'blob' is pickled \(pkl\): unpickling runs code, so Zephon never loads it"),
        (MdsTokensSource, "blob", r"column 'blob' is pickled"),
        (MdsSource, "meta", rf"{idx}: column 'meta' is json, not text \(str\)"),
        (MdsSource, "tokens", r"column 'tokens' holds token arrays \(ndarray:int32\); read it with format = \"mds_tokens\""),
        (MdsTokensSource, "text", r"column 'text' holds text \(str\); read it with format = \"mds\""),
        (MdsTokensSource, "score", r"column 'score' is ndarray:float32: float32 values are not token ids"),
        (MdsTokensSource, "id", r"column 'id' is int, not a token array \(ndarray\)"),
    ]
    for cls, column, message in cases:
        with pytest.raises(DataError, match=message) as e:
            cls(str(folder), column)
        one_line(e)


def test_a_dynamic_dtype_column_of_floats_is_refused_naming_the_sample(tmp_path):
    samples = [{"flex": np.arange(3, dtype=np.int16 if d != 5 else np.float32)} for d in range(8)]
    folder = write_mds(tmp_path / "ds", samples, columns={"flex": "ndarray"})
    src = MdsTokensSource(str(folder), "flex")
    assert [d.tolist() for d in src.read([4, 6])] == [[0, 1, 2], [0, 1, 2]]
    with pytest.raises(DataError) as e:
        src.read([5])
    assert one_line(e).endswith("sample 5: column 'flex' holds no integer array (dtype code not an integer's)")


def test_a_missing_dataset_or_a_broken_index_json_is_one_line(tmp_path):
    with pytest.raises(DataError, match=r"nowhere: no such MDS dataset folder \(no index\.json\)"):
        MdsSource(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: no index\.json in this folder nor in a sub-folder: not an MDS dataset"):
        MdsSource(str(tmp_path / "empty"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "index.json").write_text('{"version": 2, "shards": ')
    with pytest.raises(DataError, match=r"broken/index\.json: not a Streaming index\.json \(JSONDecodeError"):
        MdsSource(str(tmp_path / "broken"))
