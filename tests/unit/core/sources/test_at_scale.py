"""Sources at corpus scale: many files (globs, folders, lists), compressed JSONL, index manifests,
block shuffle, the shard cache; the same data contract as a one-file source.

Object-store behaviour (retries, coalescing, faults) is in test_s3.py.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.cli import zephon
from support.core_fixtures import CharTokenizer, epoch_exactly_once, zephon_cache_dir  # noqa: F401  (autouse: a private index cache per test)

from zephon_core import (
    DataError,
    JsonlSource,
    MegatronIndexedSource,
    ParquetSource,
    Pipeline,
    StateError,
    StaticMixture,
)
from zephon_core.curriculum.order import BlockShuffle
from zephon_core.io.files import list_files, manifest_scope
from zephon_core.io.shard_cache import ShardCache
from zephon_core.sources import manifest
from zephon_core.sources.jsonl import SUFFIXES

ROOT = Path(__file__).resolve().parents[4]


def write_shards(folder: Path, counts: list[int], *, suffix: str = ".jsonl", start: int = 0) -> list[str]:
    """Shards ``part-000<suffix>``, ... with ``counts[k]`` documents each; document texts name shard and line."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = []
    for k, n in enumerate(counts):
        lines = [json.dumps({"text": f"shard{start + k}-doc{j}"}) for j in range(n)]
        texts += [f"shard{start + k}-doc{j}" for j in range(n)]
        data = ("\n".join(lines) + ("\n" if lines else "")).encode()
        path = folder / f"part-{start + k:03d}{suffix}"
        if suffix.endswith(".gz"):
            data = gzip.compress(data)
        elif suffix.endswith(".zst"):
            data = zstandard.ZstdCompressor().compress(data)
        path.write_bytes(data)
    return texts


def all_docs(src) -> list:
    return src.read(list(range(len(src))))


# -- a source is a set of files ------------------------------------------------------------
def test_a_glob_a_folder_and_a_list_are_the_same_sorted_files(tmp_path):
    texts = write_shards(tmp_path / "d", [3, 0, 2, 1])
    (tmp_path / "d" / "notes.txt").write_text("not a shard")
    by_glob = JsonlSource(str(tmp_path / "d" / "*.jsonl"))
    by_folder = JsonlSource(str(tmp_path / "d"))
    by_list = JsonlSource([str(p) for p in sorted((tmp_path / "d").glob("*.jsonl"), reverse=True)])  # listed backwards
    for src in (by_glob, by_folder, by_list):
        assert all_docs(src) == texts and len(src.metas) == 4
    assert by_glob.fingerprint() == by_folder.fingerprint() == by_list.fingerprint()


def test_a_glob_that_matches_nothing_is_an_error_naming_it(tmp_path):
    with pytest.raises(DataError, match=r"nothing\*\.jsonl: no file matches"):
        JsonlSource(str(tmp_path / "nothing*.jsonl"))
    with pytest.raises(DataError, match="no such file or folder"):
        JsonlSource(str(tmp_path / "missing.jsonl"))
    write_shards(tmp_path / "empty", [0, 0])
    with pytest.raises(DataError, match="no documents"):
        JsonlSource(str(tmp_path / "empty"))


def test_one_plain_path_keeps_the_single_file_fingerprint(tmp_path):
    write_shards(tmp_path, [4])
    one = JsonlSource(str(tmp_path / "part-000.jsonl"))
    assert set(one.fingerprint()) == {"kind", "text_field", "size", "sample_blake2b"}
    many = JsonlSource([str(tmp_path / "part-000.jsonl")])
    assert many.fingerprint()["layout"] == "files/v1" and many.fingerprint()["files"] == 1


def test_compressed_shards_read_as_their_plain_content(tmp_path, zephon_cache_dir):  # noqa: F811
    texts = write_shards(tmp_path / "plain", [5, 3])
    write_shards(tmp_path / "gz", [5, 3], suffix=".jsonl.gz")
    write_shards(tmp_path / "zst", [5, 3], suffix=".jsonl.zst")
    for folder in ("gz", "zst"):
        src = JsonlSource(str(tmp_path / folder))
        assert all_docs(src) == texts
        assert src.read([6, 0]) == [texts[6], texts[0]]
    assert list((zephon_cache_dir / "shards").glob("*.bin")), "decompressed shards live in the shard cache"
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match=r"bad\.jsonl\.gz: cannot decompress"):
        JsonlSource(str(tmp_path / "bad.jsonl.gz"))


def test_parquet_and_megatron_sources_span_many_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from megatron.core.datasets import indexed_dataset

    texts = []
    for k, n in enumerate([2, 0, 3]):
        rows = [f"p{k}-{j}" for j in range(n)]
        texts += rows
        pq.write_table(pa.table({"text": pa.array(rows, type=pa.string())}), tmp_path / f"p{k}.parquet")
    assert all_docs(ParquetSource(str(tmp_path / "*.parquet"))) == texts
    docs = []
    for k, lengths in enumerate([[3, 1], [2]]):
        b = indexed_dataset.IndexedDatasetBuilder(str(tmp_path / f"m{k}_text_document.bin"), dtype=np.int32)
        for j, n in enumerate(lengths):
            arr = np.arange(n, dtype=np.int32) + 100 * k + 10 * j
            docs.append(arr.tolist())
            b.add_document(arr, [n])
        b.finalize(str(tmp_path / f"m{k}_text_document.idx"))
    src = MegatronIndexedSource([str(tmp_path / "m1_text_document"), str(tmp_path / "m0_text_document")])
    assert [d.tolist() for d in all_docs(src)] == docs
    tokens, lengths = src.read_flat(np.array([2, 0]))
    assert tokens.tolist() == docs[2] + docs[0] and lengths.tolist() == [2, 3]


# -- manifests -----------------------------------------------------------------------------
def test_zephon_index_writes_a_manifest_that_pipelines_use_without_opening_files(tmp_path, monkeypatch):
    texts = write_shards(tmp_path / "d", [3, 0, 4, 2], suffix=".jsonl.gz")
    r = zephon("index", str(tmp_path / "d"), "--progress")
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and "4 files, 9 documents" in r.stdout and "4/4" in r.stderr
    assert (tmp_path / "d" / manifest.MANIFEST).exists() and list((tmp_path / "d" / manifest.INDEX_DIR).glob("*.npz"))
    from zephon_core.sources.jsonl import JsonlFile

    opened = []
    original = JsonlFile.__init__
    monkeypatch.setattr(JsonlFile, "__init__", lambda self, *a, **k: opened.append(a[0]) or original(self, *a, **k))
    src = JsonlSource(str(tmp_path / "d"))
    assert opened == [] and len(src) == 9, "start-up from a manifest opens no file"
    assert src.read([8, 3]) == [texts[8], texts[3]] and len(opened) == 2  # only the files read
    assert src.fingerprint() == JsonlSource(str(tmp_path / "d"), use_manifest=False).fingerprint()


def test_a_stale_manifest_is_an_error_naming_the_file(tmp_path):
    write_shards(tmp_path / "d", [3, 2])
    assert zephon("index", str(tmp_path / "d")).returncode == 0
    with open(tmp_path / "d" / "part-001.jsonl", "a") as f:
        f.write(json.dumps({"text": "appended"}) + "\n")
    with pytest.raises(DataError, match="stale: file part-001.jsonl changed"):
        JsonlSource(str(tmp_path / "d"))
    assert zephon("index", str(tmp_path / "d")).returncode == 0
    write_shards(tmp_path / "d", [1], start=7)
    with pytest.raises(DataError, match="stale: file part-007.jsonl is not in the manifest"):
        JsonlSource(str(tmp_path / "d"))
    r = zephon("index", str(tmp_path / "d" / "part-000.jsonl"))
    assert r.returncode == 1 and "needs no manifest" in r.stderr


def test_an_added_or_changed_shard_is_refused_at_restore_naming_it(tmp_path):
    write_shards(tmp_path / "d", [4, 4, 4])

    def pipeline():
        src = JsonlSource(str(tmp_path / "d"))
        return Pipeline(StaticMixture([src], seed=1, chunk_size=4)).tokenize(CharTokenizer()).pack(16).batch(1).options(prefetch=0)

    p = pipeline()
    next(iter(p))
    state = p.checkpoint()
    write_shards(tmp_path / "d", [2], start=3)
    with pytest.raises(StateError, match="part-003.jsonl"):
        pipeline().restore(state)


# -- block shuffle -------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 17), st.integers(1, 6), st.integers(0, 3))
def test_block_shuffle_is_a_permutation_of_every_epoch_and_local(n, block, window, epoch):
    order = BlockShuffle(n, seed=5, source=0, block=block, window=window)
    docs = order.documents(np.arange(epoch * n, (epoch + 1) * n))
    assert sorted(docs.tolist()) == list(range(n))
    span = block * window
    for w in range(0, n, span):  # a window's documents come from at most `window` blocks (+ the partial one)
        assert len(set((docs[w : w + span] // block).tolist())) <= window + 1
    again = BlockShuffle(n, seed=5, source=0, block=block, window=window).documents(np.arange(epoch * n, (epoch + 1) * n)[::-1])
    assert again.tolist() == docs[::-1].tolist(), "a position maps the same alone or in any batch"


def test_block_mode_changes_the_definition_and_nothing_else_does(tmp_path):
    write_shards(tmp_path / "d", [40])
    src = JsonlSource(str(tmp_path / "d" / "part-000.jsonl"))
    plain = StaticMixture([src], seed=1)
    assert "order" not in plain.definition()
    blocks = StaticMixture([src], seed=1, block_size=8, block_window=2)
    assert blocks.definition()["order"] == {"kind": "blocks", "block_size": 8, "window": 2}


# -- the data contract over random shard layouts --------------------------------------------
def _epoch_rows(folder: Path, block: int | None, G1: int, G2: int, first: int) -> list[str]:
    return epoch_exactly_once(lambda: JsonlSource(str(folder)), CharTokenizer(), block=block, G1=G1, G2=G2, first=first)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 6), min_size=1, max_size=7).filter(lambda c: sum(c) > 0), st.sampled_from([None, 2, 3]),
       st.sampled_from([(1, 2), (2, 4), (4, 1)]), st.integers(0, 4))
def test_every_document_of_an_epoch_is_delivered_exactly_once_across_shards_resizes_and_restores(tmp_path_factory, counts, block, topo, first):
    folder = tmp_path_factory.mktemp("shards")
    texts = write_shards(folder, counts, suffix=".jsonl.gz" if len(counts) % 2 else ".jsonl")
    assert _epoch_rows(folder, block, topo[0], topo[1], first) == texts


# -- the shard cache -------------------------------------------------------------------------
def test_the_shard_cache_keeps_to_its_byte_cap_least_recently_used_first(tmp_path):
    cache = ShardCache(tmp_path / "c", max_bytes=250)
    paths = [cache.get(f"k{i}", lambda f, i=i: f.write(bytes([i]) * 100)) for i in range(2)]
    cache.get("k0", lambda f: pytest.fail("a hit must not be made again"))  # k0 is now the most recent
    cache.get("k2", lambda f: f.write(b"\x02" * 100))
    assert paths[0].exists() and not paths[1].exists(), "the least recently used entry goes first"
    assert sum(p.stat().st_size for p in (tmp_path / "c").glob("*.bin")) <= 250


def test_pipelines_of_one_node_share_the_shard_cache_without_torn_reads(tmp_path):
    texts = write_shards(tmp_path / "d", [200, 150, 120], suffix=".jsonl.zst")
    cache = tmp_path / "shared-cache"
    errors, results = [], []

    def reader() -> None:
        try:
            results.append(all_docs(JsonlSource(str(tmp_path / "d"), cache_dir=str(cache))))
        except Exception as e:  # collected and reported below
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(results) == 4 and all(r == texts for r in results)
    code = f"from zephon_core import JsonlSource; s = JsonlSource({str(tmp_path / 'd')!r}, cache_dir={str(cache)!r}); print(len(s.read(list(range(len(s))))))"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    assert [p.communicate(timeout=120)[0].strip() for p in procs] == [str(len(texts))] * 3
    assert not list(cache.glob("shards/.tmp-*")), "no temporary file is left behind"


# -- recipes ------------------------------------------------------------------------------------
def test_recipes_take_globs_folders_paths_and_block_size(tmp_path):
    from zephon_core.recipe import load_recipe

    texts = write_shards(tmp_path / "a", [2, 3])
    write_shards(tmp_path / "b", [1], start=5)
    recipe = tmp_path / "r.toml"
    recipe.write_text('block_size = 2\n[[sources]]\npaths = ["a/*.jsonl", "b"]\n[[sources]]\npath = "a"\nweight = 2\n')
    r = load_recipe(recipe)
    srcs = r.sources()
    assert all_docs(srcs[0]) == texts + ["shard5-doc0"] and all_docs(srcs[1]) == texts
    assert r.work_source().definition()["order"]["block_size"] == 2
    recipe.write_text('[[sources]]\npath = "a"\npaths = ["b"]\n')
    with pytest.raises(Exception, match=r"sources\[0\].path: give either path"):
        load_recipe(recipe)


def test_list_files_names_files_relative_to_the_root(tmp_path):
    write_shards(tmp_path / "x" / "y", [1, 1])
    fs = list_files(str(tmp_path / "x"), (".jsonl",))
    assert [fs.name(s) for s in fs.files] == ["y/part-000.jsonl", "y/part-001.jsonl"] and fs.expanded


def test_the_zstd_extra_brings_zstandard():
    """docs/sources_at_scale.md: `pip install 'zephon-suite[zstd]'` is what a .jsonl.zst source needs."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("zstandard") for dep in extras["zstd"])
    from zephon_core.io import byte_access

    assert "zephon-suite[zstd]" in Path(byte_access.__file__).read_text()


_NAMES = st.sampled_from(["a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d.txt", "e.parquet", "x1.jsonl", "x22.jsonl"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["", "sub/", "sub/deeper/", "other/"]), _NAMES), min_size=1, max_size=12, unique=True),
       st.sampled_from(["", "*.jsonl", "*.jsonl*", "x?.jsonl", "x[12]*.jsonl", "sub/*.jsonl", "**/*.jsonl", "sub/**", "*", "**"]))
def test_a_manifests_scope_is_exactly_what_a_listing_of_its_glob_or_folder_finds(tmp_path_factory, files, pattern):
    """What an object store's start-up takes from the manifest without a listing (manifest_scope) is
    the listing's file set, for any layout and any glob or folder (fsspec's glob semantics)."""
    root = tmp_path_factory.mktemp("scope")
    for folder, name in files:
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / name).write_text("{}\n")
    (root / ".zephon-index").mkdir()
    (root / ".zephon-index" / "a.jsonl.npz").write_text("sidecar")
    (root / "zephon-manifest.json").write_text("{}")
    all_files = [str(p) for p in root.rglob("*") if p.is_file()]
    spec = str(root / pattern) if pattern else str(root)
    fs, scope_root, covers = manifest_scope(spec, SUFFIXES)
    try:
        found = list_files(spec, SUFFIXES)
    except DataError:  # nothing matches: nor may the scope
        assert not any(covers(p) for p in all_files)
        return
    assert scope_root == found.root  # where the manifest is looked for
    assert sorted(p for p in all_files if covers(p)) == [f.path for f in found.files]
    assert not any(f.path.endswith(("zephon-manifest.json", ".npz")) for f in found.files)  # what `zephon index` wrote is not data
