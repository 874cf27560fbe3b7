"""Many-shard sources on a loopback S3 server, read through a fault/latency proxy the tests own:
the same documents as from local disk whatever the store does, retries bounded, failures named."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from core_fixtures import CharTokenizer, zephon_cache_dir  # noqa: F401  (autouse: a private index cache per test)

from zephon_core import DataError, JsonlSource, Pipeline, StaticMixture

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from s3_proxy import S3Proxy, every  # noqa: E402

# Our retries are what is under test: the store client gets one attempt per request.
NO_CLIENT_RETRIES = {"config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}}}


def upload(ep, prefix: str, shards: list[list[str]], suffix: str = ".jsonl") -> list[str]:
    fs = ep.filesystem()
    texts = []
    for k, docs in enumerate(shards):
        fs.pipe_file(f"{ep.bucket}/{prefix}/part-{k:03d}{suffix}", "".join(json.dumps({"text": t}) + "\n" for t in docs).encode())
        texts += docs
    return texts


def corpus(n_shards: int = 6, per: int = 40) -> list[list[str]]:
    return [[f"s{k}d{j}-" + "x" * (j % 13) for j in range(per)] for k in range(n_shards)]


def through(proxy: S3Proxy, ep) -> dict:
    so = proxy.endpoint(ep.bucket).storage_options
    so.update(NO_CLIENT_RETRIES)
    so["skip_instance_cache"] = True
    return so


def test_a_many_shard_source_on_s3_reads_like_local_disk_through_injected_faults(s3_endpoint, tmp_path):
    texts = upload(s3_endpoint, "faults", corpus())
    for fault in ("503", "500", "reset", "truncate"):
        with S3Proxy(s3_endpoint.endpoint_url, plan=every(3, fault)) as proxy:
            src = JsonlSource(s3_endpoint.url("faults", "*.jsonl"), storage_options=through(proxy, s3_endpoint), attempts=6)
            assert src.read(list(range(len(src)))) == texts, fault
            assert proxy.injected[fault] > 0, f"the proxy injected no {fault}"


def test_a_range_that_keeps_failing_is_a_data_error_naming_object_range_and_attempts(s3_endpoint):
    upload(s3_endpoint, "dead", corpus(2, 5))
    from zephon_core.tools.cli import main

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


def test_a_manifest_on_s3_is_one_read_plus_one_listing(s3_endpoint):
    import subprocess

    upload(s3_endpoint, "man", corpus(12, 3))
    env = {k: v for k, v in __import__("os").environ.items()}
    so = json.dumps(s3_endpoint.storage_options)
    r = subprocess.run([sys.executable, "-m", "zephon_core.tools.cli", "index", s3_endpoint.url("man"), "--storage-options", so],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    with S3Proxy(s3_endpoint.endpoint_url) as proxy:
        src = JsonlSource(s3_endpoint.url("man"), storage_options=through(proxy, s3_endpoint))
        assert len(src) == 36
        assert proxy.counts["GET"] <= 4, proxy.counts  # the listing (1-2 requests) and the manifest; no shard
        listed = src.files.files
        assert all("/.zephon-index/" not in st.path for st in listed) and len(listed) == 12

        # A shard added after the manifest, seen by the same process through the same (cached) store
        # client, which keeps listings: refused, naming it.
        shared = {**proxy.endpoint(s3_endpoint.bucket).storage_options, "use_listings_cache": True}
        assert len(JsonlSource(s3_endpoint.url("man"), storage_options=shared)) == 36
        s3_endpoint.filesystem().pipe_file(f"{s3_endpoint.bucket}/man/part-999.jsonl", b'{"text": "late"}\n')
        with pytest.raises(DataError, match=r"stale: file part-999\.jsonl is not in the manifest"):
            JsonlSource(s3_endpoint.url("man"), storage_options=shared)
