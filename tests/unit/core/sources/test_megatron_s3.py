"""Megatron ``.bin``/``.idx`` pairs written by megatron-core's own builder, read from a loopback S3 server
(moto) through the tests' fault and counting proxy: the same documents as from local disk, the ``.idx``
fetched once per node, the ``.bin`` read by coalesced, version-checked range GETs, a manifest start-up
that fetches no ``.idx``, and bad input refused in one line naming the file and the document."""

from __future__ import annotations

import json
import struct
from itertools import count
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.core_fixtures import epoch_exactly_once, zephon_cache_dir  # noqa: F401  (autouse: a private cache per test)

from zephon_core import DataError, MegatronIndexedSource, Pipeline, StaticMixture
from zephon_core.io.files import Access
from zephon_dev.s3_proxy import S3Proxy, every

indexed_dataset = pytest.importorskip("megatron.core.datasets.indexed_dataset")
torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:Could not determine rank:UserWarning"),
]

NO_CLIENT_RETRIES = {"config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}}}  # our retries are under test
_KEYS = count()


def documents(seed: int, n: int, multi: bool = True, size: tuple[int, int] = (1, 30)) -> list[list[np.ndarray]]:
    """``n`` documents, each a list of sequences (several when ``multi``; document 3 empty)."""
    rng = np.random.default_rng(seed)
    return [[rng.integers(0, 60000, size=int(rng.integers(0 if d == 3 else size[0], size[1]))) for _ in range(1 + (d % 3 if multi else 0))]
            for d in range(n)]


def build(prefix: Path, docs: list[list[np.ndarray]], dtype: type = np.int32) -> str:
    """``prefix``.bin/.idx written by megatron-core's IndexedDatasetBuilder, whole documents and sequence by sequence."""
    builder = indexed_dataset.IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for d, parts in enumerate(docs):
        if d % 2 == 0:
            flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
            builder.add_document(torch.from_numpy(flat.astype(np.int64)), [len(p) for p in parts])
        else:
            for p in parts:
                builder.add_item(torch.from_numpy(p.astype(np.int64)))
            builder.end_document()
    builder.finalize(f"{prefix}.idx")
    return str(prefix)


def flat(docs: list[list[np.ndarray]]) -> list[list[int]]:
    return [np.concatenate(parts).astype(np.int64).tolist() if parts else [] for parts in docs]


def upload(ep, prefixes: list[str]) -> str:
    """The pairs under a fresh folder on the server; returns its URL."""
    key = f"mg{next(_KEYS)}"
    fs = ep.filesystem()
    fs.pipe({f"{ep.bucket}/{key}/{Path(p).name}{ext}": Path(p + ext).read_bytes() for p in prefixes for ext in (".idx", ".bin")})
    return ep.url(key)


def through(proxy: S3Proxy, ep) -> dict:
    so = proxy.endpoint(ep.bucket).storage_options
    so.update(NO_CLIENT_RETRIES)
    so["skip_instance_cache"] = True
    return so


def index(ep, url: str) -> None:
    from zephon_core.cli import main

    assert main(["index", url, "--format", "megatron", "--no-progress", "--storage-options", json.dumps(ep.storage_options)]) == 0


def as_lists(docs) -> list[list[int]]:
    return [d.tolist() for d in docs]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Three pairs (uint16, int32, uint16) of 20, 0 and 30 documents; and one ~2.4 MB pair of 2,000 one-sequence documents."""
    root = tmp_path_factory.mktemp("megatron-s3")
    parts = [(documents(k, n), dtype) for k, (n, dtype) in enumerate([(20, np.uint16), (0, np.int32), (30, np.uint16)])]
    prefixes = [build(root / f"part{k}_text_document", docs, dtype) for k, (docs, dtype) in enumerate(parts)]
    big_docs = documents(9, 2000, multi=False, size=(250, 350))
    big = build(root / "big_text_document", big_docs, np.int32)
    return {"prefixes": prefixes, "docs": flat([d for docs, _ in parts for d in docs]), "big": big, "big_docs": flat(big_docs)}


# -- the same documents ---------------------------------------------------------------------------
def test_documents_on_s3_are_the_local_documents_with_the_same_fingerprint(s3_endpoint, corpus):
    url = upload(s3_endpoint, corpus["prefixes"])
    so = s3_endpoint.storage_options
    local = MegatronIndexedSource(str(Path(corpus["prefixes"][0]).parent / "part*_text_document"))
    remote = MegatronIndexedSource(url, storage_options=so)
    copied = MegatronIndexedSource(url, storage_options=so, access=Access(local_copy=True))
    assert len(remote) == len(local) == len(corpus["docs"]) == 50
    for src in (remote, copied):
        assert as_lists(src.read(list(range(len(src))))) == corpus["docs"]
        order = np.random.default_rng(4).integers(0, 50, 80)
        tokens, lengths = src.read_flat(order)
        assert tokens.tolist() == sum((corpus["docs"][d] for d in order), []) and lengths.tolist() == [len(corpus["docs"][d]) for d in order]
        assert src.fingerprint() == local.fingerprint(), "a corpus copied to a store is the same data"
        assert np.array_equal(src.token_lengths(), local.token_lengths())
    one = MegatronIndexedSource(f"{url}/part2_text_document", storage_options=so)
    assert one.fingerprint() == MegatronIndexedSource(corpus["prefixes"][2]).fingerprint()
    assert as_lists(one.read([3, 0, 3])) == [corpus["docs"][20 + d] for d in (3, 0, 3)]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 5), min_size=1, max_size=4).filter(lambda c: sum(c) > 0), st.sampled_from([None, 2]),
       st.sampled_from([(1, 2), (2, 4), (4, 1)]), st.integers(0, 3))
def test_every_document_on_s3_is_delivered_exactly_once_across_resizes_and_restores(s3_endpoint, tmp_path_factory, counts, block, topo, first):
    root = tmp_path_factory.mktemp("layout")
    docs = [documents(k, n) for k, n in enumerate(counts)]
    url = upload(s3_endpoint, [build(root / f"p{k}_text_document", d, np.uint16) for k, d in enumerate(docs)])
    so = s3_endpoint.storage_options
    got = epoch_exactly_once(lambda: MegatronIndexedSource(url, storage_options=so), None, block=block, G1=topo[0], G2=topo[1], first=first)
    assert as_lists(got) == flat([d for part in docs for d in part])


def _pipeline(src: MegatronIndexedSource, block: int | None = 64) -> Pipeline:
    ws = StaticMixture([src], seed=5, chunk_size=16, block_size=block, block_window=2)
    return Pipeline(ws).pack(256).batch(2).options(prefetch=0, reader_threads=0)


def test_a_restore_on_s3_is_a_seek_whose_cost_does_not_grow_with_the_position(s3_endpoint, corpus):
    url = upload(s3_endpoint, [corpus["big"]])
    index(s3_endpoint, url)
    with S3Proxy(s3_endpoint.endpoint_url) as proxy:
        so = through(proxy, s3_endpoint)
        costs = []
        for at in (2, 60):
            p = _pipeline(MegatronIndexedSource(url, storage_options=so))
            it = iter(p)
            for _ in range(at):
                next(it)
            state, want = p.checkpoint(), next(it).digest
            p.close()
            q = _pipeline(MegatronIndexedSource(url, storage_options=so))
            proxy.reset_counts()
            q.restore(state)
            assert next(iter(q)).digest == want
            costs.append(proxy.counts["GET"])
            q.close()
    assert costs[1] <= costs[0] + 1 and costs[1] <= 4, f"GETs to the first batch after a restore at batch 2 and 60: {costs}"


# -- the store misbehaves -----------------------------------------------------------------------------
@pytest.mark.parametrize("fault", ["503", "500", "reset", "truncate"])
def test_faults_of_the_store_are_retried_and_the_documents_are_unchanged(s3_endpoint, corpus, tmp_path, fault):
    url = upload(s3_endpoint, corpus["prefixes"] + [corpus["big"]])
    with S3Proxy(s3_endpoint.endpoint_url, plan=every(3, fault)) as proxy:
        src = MegatronIndexedSource(url, storage_options=through(proxy, s3_endpoint), access=Access(attempts=6, cache_dir=str(tmp_path)))
        order = np.random.default_rng(1).permutation(len(src))
        assert as_lists(src.read(order.tolist())) == [(corpus["big_docs"] + corpus["docs"])[d] for d in order]
        assert proxy.injected[fault] > 0, f"the proxy injected no {fault}"


def test_a_range_that_keeps_failing_names_the_bin_the_bytes_and_the_attempts(s3_endpoint, corpus):
    url = upload(s3_endpoint, [corpus["big"]])
    index(s3_endpoint, url)
    fail_bin = lambda n, m, path, h: "500" if m == "GET" and path.endswith(".bin") else None  # noqa: E731
    with S3Proxy(s3_endpoint.endpoint_url, plan=fail_bin) as proxy:
        src = MegatronIndexedSource(url, storage_options=through(proxy, s3_endpoint), access=Access(attempts=3))
        with pytest.raises(DataError, match=r"s3://zephon-test/mg\d+/big_text_document\.bin: bytes \d+-\d+: failed after 3 attempt\(s\)"):
            src.read([1500])


# -- requests ------------------------------------------------------------------------------------------
def _gets(asked: list[tuple[str, str]], ending: str) -> int:
    return sum(1 for m, path in asked if m == "GET" and path.split("?")[0].endswith(ending))


def test_the_idx_is_fetched_once_per_node_and_a_batch_of_nearby_documents_costs_one_request(s3_endpoint, corpus, tmp_path):
    url = upload(s3_endpoint, [corpus["big"]])
    asked: list[tuple[str, str]] = []
    with S3Proxy(s3_endpoint.endpoint_url, plan=lambda n, m, path, h: asked.append((m, path))) as proxy:
        so = through(proxy, s3_endpoint)
        first = MegatronIndexedSource(f"{url}/big_text_document", storage_options=so, access=Access(cache_dir=str(tmp_path)))
        assert _gets(asked, ".idx") == 1
        asked.clear()
        # 200 consecutive documents (~240 KB of the 2.4 MB .bin): one read_many, one range request.
        tokens, lengths = first.read_flat(np.arange(1000, 1200))
        assert tokens.tolist() == sum(corpus["big_docs"][1000:1200], [])
        assert _gets(asked, ".bin") <= 2, asked  # the pages they span: one run, one request (two if it crosses a MiB at a page edge)
        asked.clear()
        shuffled = np.random.default_rng(0).permutation(2000)[:100]
        tokens, _ = first.read_flat(shuffled)  # spread over the whole file: at most one request per run of missing pages
        assert tokens.tolist() == sum((corpus["big_docs"][d] for d in shuffled), []) and _gets(asked, ".bin") <= 2, asked
        asked.clear()
        second = MegatronIndexedSource(f"{url}/big_text_document", storage_options=so, access=Access(cache_dir=str(tmp_path)))
        assert as_lists(second.read([7, 1999])) == [corpus["big_docs"][7], corpus["big_docs"][1999]]
        assert _gets(asked, ".idx") == 0, f"the second source of the node fetched the .idx again: {asked}"


# -- manifests and versions -------------------------------------------------------------------------
def test_a_manifest_start_up_fetches_no_idx_and_each_idx_on_its_first_read(s3_endpoint, corpus, tmp_path):
    root = tmp_path / "many"
    root.mkdir()
    docs = [documents(k, 3) for k in range(12)]
    url = upload(s3_endpoint, [build(root / f"s{k:02d}_text_document", d, np.uint16) for k, d in enumerate(docs)])
    index(s3_endpoint, url)
    asked: list[tuple[str, str]] = []
    with S3Proxy(s3_endpoint.endpoint_url, plan=lambda n, m, path, h: asked.append((m, path))) as proxy:
        # A node of its own: `zephon index` ran in this process and left every .idx in this test's cache.
        src = MegatronIndexedSource(url, storage_options=through(proxy, s3_endpoint), access=Access(cache_dir=str(tmp_path / "node")))
        assert len(src) == 36 and not src.files.listed
        assert _gets(asked, ".idx") == _gets(asked, ".bin") == 0 and ("GET", url.replace("s3:/", "") + "/zephon-manifest.json") in asked, asked
        assert len(asked) <= 2, f"start-up: the manifest and at most the folder check, got {asked}"
        asked.clear()
        assert as_lists(src.read([16, 17])) == flat(docs[5])[1:3]
        assert _gets(asked, "s05_text_document.idx") == 1 and _gets(asked, ".idx") == 1
        assert not [a for a in asked if a[0] == "HEAD"], f"the manifest has the .bin's size and ETag: {asked}"
        assert src.fingerprint() == MegatronIndexedSource(url, storage_options=s3_endpoint.storage_options, use_manifest=False).fingerprint()


def test_a_bin_or_idx_rewritten_on_the_store_is_refused_naming_it(s3_endpoint, corpus, tmp_path):
    url = upload(s3_endpoint, corpus["prefixes"])
    index(s3_endpoint, url)
    so = {**s3_endpoint.storage_options, "skip_instance_cache": True}  # no listing cached by an earlier source answers for the store
    fs = s3_endpoint.filesystem()
    key = url.replace("s3://", "")
    src = MegatronIndexedSource(url, storage_options=so, use_manifest=False)  # listed: the .bin's ETag from its HEAD now
    data = bytearray(Path(corpus["prefixes"][2] + ".bin").read_bytes())
    data[:2] = bytes([data[0] ^ 1, data[1]])  # same size, other content: only the ETag tells
    fs.pipe_file(f"{key}/part2_text_document.bin", bytes(data))
    assert as_lists(src.read([0])) == [corpus["docs"][0]]
    with pytest.raises(DataError, match=r"part2_text_document\.bin: stale: the object changed .*etag [0-9a-f]+ -> [0-9a-f]+"):
        src.read([25])
    from_manifest = MegatronIndexedSource(url, storage_options=so)  # the manifest recorded the .bin's old ETag
    with pytest.raises(DataError, match=r"part2_text_document\.bin: stale: the object changed"):
        from_manifest.read([25])
    idx = Path(corpus["prefixes"][0] + ".idx").read_bytes()
    fs.pipe_file(f"{key}/part0_text_document.idx", idx[:-1] + bytes([idx[-1] ^ 1]))  # rewritten: a new ETag
    # A fresh node (cache): this node's copy is the very version the manifest records, and reads as that.
    fresh = MegatronIndexedSource(url, storage_options=so, access=Access(cache_dir=str(tmp_path)))
    with pytest.raises(DataError, match=r"part0_text_document\.idx: stale: the object changed"):
        fresh.read([0])


# -- bad input ---------------------------------------------------------------------------------------
def _patched(path: str, offset: int, fmt: str, value: int) -> bytes:
    data = bytearray(Path(path).read_bytes())
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


def test_bad_pairs_on_the_store_are_one_line_errors_naming_the_file(s3_endpoint, corpus):
    good = corpus["prefixes"][0]
    idx, bin_ = Path(good + ".idx").read_bytes(), Path(good + ".bin").read_bytes()
    cases = {
        "magic": (b"XXXX" + idx[4:], bin_, ".idx", "not a Megatron index"),
        "version": (_patched(good + ".idx", 9, "<Q", 2), bin_, ".idx", "unsupported index version 2"),
        "dtype": (_patched(good + ".idx", 17, "<B", 6), bin_, ".idx", "dtype code 6 is not an integer token type"),
        "counts": (_patched(good + ".idx", 18, "<Q", 10**6), bin_, ".idx", "truncated"),
        "short bin": (idx, bin_[:-4], ".bin", r"truncated: \d+ bytes, the index points up to byte \d+ \(document \d+ is the first past the end\)"),
        "long bin": (idx, bin_ + b"\0\0", ".bin", "do not belong together"),
        "no bin": (idx, None, ".bin", "no such file"),
    }
    fs = s3_endpoint.filesystem()
    for name, (idx_data, bin_data, ext, words) in cases.items():
        key = f"{s3_endpoint.bucket}/bad{next(_KEYS)}"
        fs.pipe_file(f"{key}/x_text_document.idx", idx_data)
        if bin_data is not None:
            fs.pipe_file(f"{key}/x_text_document.bin", bin_data)
        with pytest.raises(DataError) as e:
            MegatronIndexedSource(f"s3://{key}/x_text_document", storage_options=s3_endpoint.storage_options)
        msg = str(e.value)
        assert msg.startswith(f"s3://{key}/x_text_document{ext}: ") and "\n" not in msg, (name, msg)
        assert __import__("re").search(words, msg), (name, msg)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_pointer_past_the_bin_is_refused_at_its_read_naming_the_document(s3_endpoint, corpus, tmp_path, where):
    good = corpus["prefixes"][0]
    n_seq = struct.unpack_from("<Q", Path(good + ".idx").read_bytes(), 18)[0]
    seq = 3  # document 2's first sequence (documents 0, 1, 2 have 1, 2, 3 sequences)
    bad = tmp_path / "p_text_document"
    (tmp_path / "p_text_document.idx").write_bytes(_patched(good + ".idx", 34 + 4 * n_seq + 8 * seq, "<q", 10**9))
    (tmp_path / "p_text_document.bin").write_bytes(Path(good + ".bin").read_bytes())
    path = str(bad) if where == "local" else upload(s3_endpoint, [str(bad)]) + "/p_text_document"
    src = MegatronIndexedSource(path, storage_options=s3_endpoint.storage_options if where == "s3" else None)
    assert as_lists(src.read([0, 1])) == corpus["docs"][:2]
    with pytest.raises(DataError, match=r"p_text_document\.idx: document 2 \(sequence 3\) points at bytes 1000000000\.\.\d+ of .*p_text_document\.bin"):
        src.read([2])


def test_a_local_bin_rewritten_after_its_manifest_is_refused_at_its_first_read(corpus, tmp_path):
    import shutil

    for p in corpus["prefixes"]:
        for ext in (".idx", ".bin"):
            shutil.copy(p + ext, tmp_path / (Path(p).name + ext))
    from zephon_core.cli import main

    assert main(["index", str(tmp_path), "--format", "megatron", "--no-progress"]) == 0
    data = bytearray((tmp_path / "part2_text_document.bin").read_bytes())
    data[0] ^= 1  # same size: the listing (of the .idx files) cannot tell, the .bin's sample in the manifest can
    (tmp_path / "part2_text_document.bin").write_bytes(bytes(data))
    src = MegatronIndexedSource(str(tmp_path))
    assert as_lists(src.read([0])) == [corpus["docs"][0]]
    with pytest.raises(DataError, match=r"part2_text_document\.bin: stale: changed since the manifest was written .*rebuild it with `zephon index`"):
        src.read([25])
