"""Many-shard sources on a loopback S3 server, read through a fault/latency proxy the tests own:
the same documents as from local disk whatever the store does, retries bounded, failures named."""

from __future__ import annotations

import json
import subprocess

import pytest
from support.cli import zephon
from support.core_fixtures import CharTokenizer, zephon_cache_dir  # noqa: F401  (autouse: a private index cache per test)

from zephon_core import DataError, JsonlSource, Pipeline, StaticMixture
from zephon_core.io.files import Access
from zephon_dev.s3_proxy import S3Proxy, every, through


def upload(ep, prefix: str, shards: list[list[str]], suffix: str = ".jsonl") -> list[str]:
    fs = ep.filesystem()
    texts = []
    for k, docs in enumerate(shards):
        fs.pipe_file(f"{ep.bucket}/{prefix}/part-{k:03d}{suffix}", "".join(json.dumps({"text": t}) + "\n" for t in docs).encode())
        texts += docs
    return texts


def corpus(n_shards: int = 6, per: int = 40) -> list[list[str]]:
    return [[f"s{k}d{j}-" + "x" * (j % 13) for j in range(per)] for k in range(n_shards)]


def test_a_many_shard_source_on_s3_reads_like_local_disk_through_injected_faults(s3_endpoint, tmp_path):
    import gzip

    texts = upload(s3_endpoint, "faults", corpus())
    extra = [f"gz{j}-" + "z" * (j % 7) for j in range(30)]
    s3_endpoint.filesystem().pipe_file(f"{s3_endpoint.bucket}/faults/part-100.jsonl.gz",
                                       gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in extra).encode()))
    texts += extra
    for fault in ("503", "500", "reset", "truncate"):
        with S3Proxy(s3_endpoint.endpoint_url, plan=every(3, fault)) as proxy:
            # A cache folder per round: the compressed shard is fetched (and decompressed) through the faults every time.
            src = JsonlSource(s3_endpoint.url("faults", "*.jsonl*"), storage_options=through(proxy, s3_endpoint), attempts=6,
                              cache_dir=str(tmp_path / fault))
            assert src.read(list(range(len(src)))) == texts, fault
            assert proxy.injected[fault] > 0, f"the proxy injected no {fault}"


def test_a_range_that_keeps_failing_is_a_data_error_naming_object_range_and_attempts(s3_endpoint):
    upload(s3_endpoint, "dead", corpus(2, 5))
    from zephon_core.cli import main

    # With a manifest, start-up reads no shard: the failure comes at the first read of part-001.
    assert main(["index", s3_endpoint.url("dead"), "--storage-options", json.dumps(s3_endpoint.storage_options)]) == 0
    with S3Proxy(s3_endpoint.endpoint_url, plan=lambda n, m, path, h: "500" if m == "GET" and "range" in {k.lower() for k in h} else None) as proxy:
        src = JsonlSource(s3_endpoint.url("dead", "*.jsonl"), storage_options=through(proxy, s3_endpoint), attempts=3)
        with pytest.raises(DataError, match=r"s3://zephon-test/dead/part-001\.jsonl: bytes \d+-\d+: failed after 3 attempt\(s\)"):
            src.read([7])


def test_block_mode_serves_many_documents_per_request(s3_endpoint):
    """The same documents in per-document and in block order: block order needs far fewer range GETs."""
    upload(s3_endpoint, "blocks", [[f"doc{k}-{j}-" + "y" * 3000 for j in range(120)] for k in range(8)])  # ~3 KB documents, ~360 KB shards

    def gets(block_size):
        with S3Proxy(s3_endpoint.endpoint_url) as proxy:
            src = JsonlSource(s3_endpoint.url("blocks", "*.jsonl"), storage_options=through(proxy, s3_endpoint))
            ws = StaticMixture([src], seed=3, chunk_size=16, block_size=block_size, block_window=2)
            p = Pipeline(ws).tokenize(CharTokenizer()).pack(4096).batch(1).options(prefetch=0, reader_threads=0)
            it = iter(p)
            proxy.reset_counts()
            rows = [next(it).digest for _ in range(60)]
            p.close()
            return proxy.range_gets, rows

    per_doc, _ = gets(None)
    per_block, _ = gets(64)
    assert per_block * 4 <= per_doc, (per_block, per_doc)


def test_a_local_copy_and_a_compressed_shard_on_s3_read_through_the_shard_cache(s3_endpoint, zephon_cache_dir):  # noqa: F811
    import gzip

    texts = upload(s3_endpoint, "copy", corpus(3, 20))
    fs = s3_endpoint.filesystem()
    fs.pipe_file(f"{s3_endpoint.bucket}/gz/part-000.jsonl.gz", gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in texts).encode()))
    copied = JsonlSource(s3_endpoint.url("copy"), storage_options=s3_endpoint.storage_options, local_copy=True)
    assert copied.read(list(range(len(copied)))) == texts
    gz = JsonlSource(s3_endpoint.url("gz", "part-000.jsonl.gz"), storage_options=s3_endpoint.storage_options)
    assert gz.read(list(range(len(gz)))) == texts
    assert len(list((zephon_cache_dir / "shards").glob("*.bin"))) == 4


def index(ep, url: str, *extra: str) -> subprocess.CompletedProcess:
    so = json.dumps(ep.storage_options)
    return zephon("index", url, "--storage-options", so, *extra, timeout=300)


def test_a_manifest_on_s3_is_the_one_request_at_start_up_and_every_read_checks_its_version(s3_endpoint):
    texts = upload(s3_endpoint, "man", corpus(12, 3))
    r = index(s3_endpoint, s3_endpoint.url("man"))
    assert r.returncode == 0, r.stderr
    asked: list[tuple[str, str]] = []
    with S3Proxy(s3_endpoint.endpoint_url, plan=lambda n, m, path, h: asked.append((m, path))) as proxy:
        so = through(proxy, s3_endpoint)
        src = JsonlSource(s3_endpoint.url("man"), storage_options=so)
        assert len(src) == 36 and not src.files.listed
        assert asked == [("GET", "/zephon-test/man/zephon-manifest.json")], asked  # no listing, no shard
        assert src.read(list(range(36))) == texts
        listed = JsonlSource(s3_endpoint.url("man"), storage_options=so, access=Access(verify_listing=True))
        assert listed.files.listed and listed.fingerprint() == src.fingerprint()
        assert [st.etag for st in listed.files.files] == [st.etag for st in src.files.files]

    fs = s3_endpoint.filesystem()
    # Added after `zephon index`: not part of the source (the manifest is its file set) until the next
    # `zephon index`; listing it (--check, verify_listing) names it.
    fs.pipe_file(f"{s3_endpoint.bucket}/man/part-999.jsonl", b'{"text": "late"}\n')
    late = JsonlSource(s3_endpoint.url("man", "*.jsonl"), storage_options=s3_endpoint.storage_options)
    assert late.fingerprint() == src.fingerprint() and late.read(list(range(36))) == texts
    with pytest.raises(DataError, match=r"stale: file part-999\.jsonl is not in the manifest"):
        JsonlSource(s3_endpoint.url("man"), storage_options=s3_endpoint.storage_options, access=Access(verify_listing=True))
    r = index(s3_endpoint, s3_endpoint.url("man"), "--check")
    assert r.returncode == 1 and "stale: file part-999.jsonl is not in the manifest" in r.stderr, r.stderr
    fs.rm_file(f"{s3_endpoint.bucket}/man/part-999.jsonl")
    r = index(s3_endpoint, s3_endpoint.url("man"), "--check")
    assert r.returncode == 0 and "the manifest matches the listing: 12 files, 36 documents" in r.stdout, r.stderr

    # Rewritten with the same size (the content sample and the size alone would not tell) or deleted:
    # the first read of it is refused, naming it; the other files still read.
    fs.pipe_file(f"{s3_endpoint.bucket}/man/part-003.jsonl", "".join(json.dumps({"text": t.upper()}) + "\n" for t in texts[9:12]).encode())
    fs.rm_file(f"{s3_endpoint.bucket}/man/part-005.jsonl")
    stale = JsonlSource(s3_endpoint.url("man"), storage_options=s3_endpoint.storage_options)
    assert stale.read([0, 35]) == [texts[0], texts[35]]
    with pytest.raises(DataError, match=r"s3://zephon-test/man/part-003\.jsonl: stale: the object changed .*etag [0-9a-f]+ -> [0-9a-f]+"):
        stale.read([9])
    with pytest.raises(DataError, match=r"s3://zephon-test/man/part-005\.jsonl: stale: .* the store does not any more"):
        stale.read([15])


def test_a_parquet_folder_on_s3_from_its_manifest_refuses_a_rewritten_file(s3_endpoint):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon_core import ParquetSource

    def parquet(rows: list[str]) -> bytes:
        buf = io.BytesIO()
        pq.write_table(pa.table({"text": pa.array(rows, type=pa.string())}), buf)
        return buf.getvalue()

    fs = s3_endpoint.filesystem()
    shards = [[f"p{k}-{j}" for j in range(n)] for k, n in enumerate([3, 0, 4])]
    for k, rows in enumerate(shards):
        fs.pipe_file(f"{s3_endpoint.bucket}/pq/part-{k}.parquet", parquet(rows))
    assert index(s3_endpoint, s3_endpoint.url("pq"), "--format", "parquet").returncode == 0
    src = ParquetSource(s3_endpoint.url("pq"), storage_options=s3_endpoint.storage_options)
    assert not src.files.listed and src.read(list(range(7))) == shards[0] + shards[2]
    fs.pipe_file(f"{s3_endpoint.bucket}/pq/part-2.parquet", parquet([r.upper() for r in shards[2]]))
    stale = ParquetSource(s3_endpoint.url("pq"), storage_options=s3_endpoint.storage_options)
    assert stale.read([0]) == ["p0-0"]
    with pytest.raises(DataError, match=r"part-2\.parquet: stale: the object changed .*etag"):
        stale.read([3])


def test_a_parquet_source_uses_every_access_setting_its_cache_dir_and_local_copy(s3_endpoint, tmp_path):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon_core import ParquetSource

    fs = s3_endpoint.filesystem()
    shards = [[f"q{k}-{j}" for j in range(4)] for k in range(2)]
    stored = []
    for k, rows in enumerate(shards):
        buf = io.BytesIO()
        pq.write_table(pa.table({"text": pa.array(rows, type=pa.string())}), buf)
        stored.append(buf.getvalue())
        fs.pipe_file(f"{s3_endpoint.bucket}/pqc/part-{k}.parquet", stored[-1])
    url, so = s3_endpoint.url("pqc"), s3_endpoint.storage_options
    in_place = ParquetSource(url, storage_options=so, access=Access(cache_dir=str(tmp_path / "none")))
    assert in_place.read(list(range(8))) == shards[0] + shards[1] and not (tmp_path / "none" / "shards").exists()
    given = Access(cache_dir=str(tmp_path / "a"), local_copy=True)  # as a recipe's access settings arrive
    for cache, make in [("a", lambda: ParquetSource(url, storage_options=so, access=given)),
                        ("k", lambda: ParquetSource(url, storage_options=so, cache_dir=str(tmp_path / "k"),
                                                    local_copy=True))]:
        src = make()
        assert src.read(list(range(8))) == shards[0] + shards[1]
        copies = sorted(p.read_bytes() for p in (tmp_path / cache / "shards").glob("*.bin"))
        assert copies == sorted(stored), "each shard copied whole into the cache_dir's shard cache, and read from there"
