"""Bad input: every case ends in an error that names the file and the line,
row or field (or, for valid but unusual input, in the exact data)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import relkit

from zephon_core import (
    ConfigError,
    DataError,
    JsonlSource,
    MegatronIndexedSource,
    ParquetSource,
    StateError,
    TokenArraySource,
)
from zephon_core.recipe import load_recipe

# -- JSONL ------------------------------------------------------------------------
GOOD = '{"text": "fine"}\n'
JSONL_CASES = {
    # name: (file bytes, line named in the error, words in the error)
    "malformed JSON": (GOOD * 2 + '{"text": "no end"\n' + GOOD, 3, ["malformed JSON"]),
    "not UTF-8": (GOOD + '{"text": "caf\xe9"}\n'.encode("latin-1").decode("latin-1"), 2, ["UTF-8"]),
    "array, not object": (GOOD * 4 + '["text", "x"]\n', 5, ["JSON object"]),
    "field missing": (GOOD + '{"body": "x"}\n', 2, ["missing field 'text'"]),
    "field is a number": (GOOD * 2 + '{"text": 12}\n', 3, ["'text'", "string", "int"]),
    "field is null": (GOOD + '{"text": null}\n', 2, ["'text'", "NoneType"]),
    "trailing garbage": (GOOD + '{"text": "a"} x\n', 2, ["malformed JSON"]),
    "truncated last line": (GOOD * 3 + '{"text": "cut', 4, ["malformed JSON"]),
    "NaN literal in a record": (GOOD + '{"text": "a", "w": NaN}\n' + '{"text": "b"\n', 3, ["malformed JSON"]),
}


def _write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("latin-1") if "\xe9" in text else text.encode())
    return path


@pytest.mark.parametrize("name", list(JSONL_CASES))
def test_malformed_jsonl_rows_name_file_and_line(tmp_path, rel, name):
    content, line, words = JSONL_CASES[name]
    path = _write(tmp_path / "bad.jsonl", content)
    with pytest.raises(DataError) as e:
        JsonlSource(str(path))
    msg = str(e.value)
    assert f"{path}:{line}:" in msg, msg
    for w in words:
        assert w in msg, msg
    rel.case(f"JSONL: {name}", "DataError naming file:line")


@pytest.mark.parametrize("content", ["", "\n\n  \n", "\r\n"])
def test_empty_jsonl(tmp_path, rel, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(DataError) as e:
        JsonlSource(str(path))
    assert str(path) in str(e.value) and "no documents" in str(e.value)
    rel.case(f"JSONL: empty file {content!r}", "DataError naming the file")


def test_giant_jsonl_lines(tmp_path, rel):
    """A 20 MB record is data, not an error: it is read back whole; a 20 MB
    malformed record is an error naming its line."""
    big = "x" * (20 * 1024 * 1024)
    path = tmp_path / "giant.jsonl"
    with open(path, "w") as f:
        f.write(GOOD)
        f.write(json.dumps({"text": big}) + "\n")
        f.write(GOOD)
    src = JsonlSource(str(path))
    assert len(src) == 3
    got = src.read([1, 2, 0])
    assert got[0] == big and got[1:] == ["fine", "fine"]
    rel.case("JSONL: 20 MB line", "read back exactly", samples=3)
    bad = tmp_path / "giant-bad.jsonl"
    with open(bad, "w") as f:
        f.write(GOOD * 2)
        f.write('{"text": "' + big + '\n')  # unterminated string
    with pytest.raises(DataError) as e:
        JsonlSource(str(bad))
    assert f"{bad}:3:" in str(e.value) and len(str(e.value)) < 500
    rel.case("JSONL: 20 MB malformed line", "DataError naming file:line (short message)")


# -- Parquet -----------------------------------------------------------------------
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _parquet(path: Path, column, name: str = "text", row_group_size: int = 50) -> Path:
    pq.write_table(pa.table({name: column}), path, row_group_size=row_group_size)
    return path


def test_parquet_bad_inputs_name_the_file(tmp_path, rel):
    cases = []
    p = _parquet(tmp_path / "ints.parquet", pa.array(list(range(10))))
    cases.append(("integer text column", p, None, ["column 'text'", "string"]))
    p = _parquet(tmp_path / "other.parquet", pa.array(["a"] * 5), name="body")
    cases.append(("no text column", p, None, ["no column 'text'", "body"]))
    p = _parquet(tmp_path / "empty.parquet", pa.array([], type=pa.string()))
    cases.append(("no rows", p, None, ["no documents"]))
    p = tmp_path / "noise.parquet"
    p.write_bytes(b"PAR1" + bytes(range(256)) * 4)
    cases.append(("not Parquet", p, None, ["not a readable Parquet file"]))
    good = _parquet(tmp_path / "good.parquet", pa.array([f"row {i}" for i in range(200)]))
    p = tmp_path / "truncated.parquet"
    p.write_bytes(good.read_bytes()[:-100])
    cases.append(("truncated", p, None, ["not a readable Parquet file"]))
    p = _parquet(tmp_path / "nulls.parquet", pa.array(["a", "b", None, "d"]))
    cases.append(("null row", p, [0, 1, 2, 3], ["row 2", "null"]))
    for name, path, read, words in cases:
        with pytest.raises(DataError) as e:
            src = ParquetSource(str(path))
            src.read(read)
        msg = str(e.value)
        assert str(path) in msg and all(w in msg for w in words), (name, msg)
        rel.case(f"Parquet: {name}", "DataError naming file (and row)")


def test_parquet_corrupted_page_names_the_file(tmp_path, rel):
    """Bytes of row group 1's column chunk overwritten: the read fails with a
    DataError naming the file and row group, not a bare pyarrow error."""
    good = _parquet(tmp_path / "good.parquet", pa.array([f"document {i} " * 8 for i in range(200)]))
    meta = pq.ParquetFile(good).metadata.row_group(1).column(0)
    start = meta.dictionary_page_offset or meta.data_page_offset
    data = bytearray(good.read_bytes())
    data[start : start + meta.total_compressed_size] = b"\xff" * meta.total_compressed_size
    bad = tmp_path / "corrupt.parquet"
    bad.write_bytes(bytes(data))
    src = ParquetSource(str(bad))
    assert src.read([0]) == ["document 0 " * 8]  # row group 0 is intact
    try:
        src.read([60])
    except DataError as e:
        rel.case("Parquet: corrupted column chunk", "DataError naming file")
        assert str(bad) in str(e)
    except Exception as e:  # noqa: BLE001
        rel.case("Parquet: corrupted column chunk", f"FAILED: bare {type(e).__name__} without the file name")
        raise AssertionError(f"a corrupted row group raised a bare {type(e).__name__} ({e}), not a DataError naming {bad}") from None
    else:
        raise AssertionError("a corrupted row group was read without an error")


# -- pretokenized: NumPy arrays and Megatron .bin/.idx -------------------------------
def test_token_arrays_wrong_dtypes(tmp_path, rel):
    np.save(tmp_path / "offsets.npy", np.array([0, 2, 5], dtype=np.int64))
    for name, arr, words in [
        ("float tokens", np.array([1.0, 2, 3, 4, 5]), ["tokens must be a 1-D integer array", "float64"]),
        ("2-D tokens", np.arange(10).reshape(2, 5), ["1-D integer array"]),
        ("object tokens", np.array([1, "a", None, 4, 5], dtype=object), ["cannot read the tokens array"]),
        ("too few tokens", np.arange(4), ["end at the token count 4"]),
    ]:
        path = tmp_path / f"{name.replace(' ', '_')}.npy"
        np.save(path, arr, allow_pickle=True)
        with pytest.raises(DataError) as e:
            TokenArraySource(str(path), str(tmp_path / "offsets.npy"))
        assert all(w in str(e.value) for w in words) and (str(path) in str(e.value) or "offsets" in str(e.value)), str(e.value)
        rel.case(f"token array: {name}", "DataError naming file")


@pytest.fixture(scope="module")
def megatron_pair(tmp_path_factory):
    indexed_dataset = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    torch = pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("megatron")
    out = {}
    for name, dtype, n in (("small", np.uint16, 20), ("large", np.int32, 60)):
        b = indexed_dataset.IndexedDatasetBuilder(str(root / f"{name}.bin"), dtype=dtype)
        for d in range(n):
            b.add_item(torch.tensor([d * 100 + j for j in range(3 + d % 7)], dtype=torch.int64))
            b.end_document()
        b.finalize(str(root / f"{name}.idx"))
        out[name] = str(root / name)
    return out


def _copy_pair(prefix: str, dest: Path, name: str, bin_from: str | None = None) -> str:
    out = dest / name
    Path(str(out) + ".idx").write_bytes(Path(prefix + ".idx").read_bytes())
    Path(str(out) + ".bin").write_bytes(Path((bin_from or prefix) + ".bin").read_bytes())
    return str(out)


def _patch_idx(prefix: str, offset: int, fmt: str, value) -> None:
    data = bytearray(Path(prefix + ".idx").read_bytes())
    struct.pack_into(fmt, data, offset, value)
    Path(prefix + ".idx").write_bytes(bytes(data))


def test_megatron_pairs_that_do_not_match(megatron_pair, tmp_path, rel):
    """.bin/.idx written by Megatron's IndexedDatasetBuilder, then corrupted."""
    ok = MegatronIndexedSource(megatron_pair["small"])
    assert len(ok) == 20 and ok.read([3])[0].tolist() == [300 + j for j in range(6)]
    cases = []
    p = _copy_pair(megatron_pair["small"], tmp_path, "float")
    _patch_idx(p, 17, "<B", 6)  # dtype code -> float64
    cases.append(("dtype code float64", p, ".idx", ["dtype code 6"]))
    p = _copy_pair(megatron_pair["small"], tmp_path, "bogus")
    _patch_idx(p, 17, "<B", 42)
    cases.append(("unknown dtype code", p, ".idx", ["dtype code 42"]))
    p = _copy_pair(megatron_pair["small"], tmp_path, "version")
    _patch_idx(p, 9, "<Q", 2)
    cases.append(("index version 2", p, ".idx", ["version 2"]))
    p = _copy_pair(megatron_pair["large"], tmp_path, "shortbin", bin_from=megatron_pair["small"])
    cases.append(("idx of a larger dataset, bin of a smaller", p, ".bin", ["truncated"]))
    p = _copy_pair(megatron_pair["small"], tmp_path, "counts")
    _patch_idx(p, 18, "<Q", 10**6)  # sequence count
    cases.append(("sequence count too large", p, ".idx", ["truncated"]))
    for name, prefix, ext, words in cases:
        with pytest.raises(DataError) as e:
            MegatronIndexedSource(prefix)
        msg = str(e.value)
        assert prefix + ext in msg and all(w in msg for w in words), (name, msg)
        rel.case(f"Megatron: {name}", "DataError naming the file")


@pytest.mark.parametrize("case", ["bin of a larger dataset", "dtype uint16 read as uint8"])
def test_megatron_silent_mismatch_is_refused(megatron_pair, tmp_path, rel, case):
    """Pairs whose sizes do not add up the other way: the .bin holds more bytes
    than the index describes. Megatron's writer never produces that, so the
    pair does not belong together and reading it gives other tokens."""
    if case == "bin of a larger dataset":
        p = _copy_pair(megatron_pair["small"], tmp_path, "longbin", bin_from=megatron_pair["large"])
    else:
        p = _copy_pair(megatron_pair["small"], tmp_path, "u8")
        _patch_idx(p, 17, "<B", 1)  # uint16 data declared uint8
    try:
        src = MegatronIndexedSource(p)
    except DataError as e:
        assert p + ".bin" in str(e) or p + ".idx" in str(e), str(e)
        rel.case(f"Megatron: {case}", "DataError naming the file")
        return
    got = src.read([3])[0].tolist()
    rel.case(f"Megatron: {case}", f"FAILED: accepted, document 3 reads {got[:4]}... instead of [300, 301, ...]")
    raise AssertionError(f"{case}: accepted silently; document 3 reads {got} (written: {[300 + j for j in range(6)]})")


# -- recipes -------------------------------------------------------------------------
RECIPE_OK = """
seed = 1
chunk_size = 8
[[sources]]
path = "docs.jsonl"
"""
RECIPE_CASES = {
    # name: (text, words in the error)
    "unknown top-level key": (RECIPE_OK + "sede = 2\n", ["sede"]),
    "unknown key in a source": (RECIPE_OK + 'wieght = 2.0\n', ["wieght"]),
    "unknown section": (RECIPE_OK + "[shufle]\nwindow = 4\n", ["shufle"]),
    "unknown key in [aggregate]": (RECIPE_OK + "[aggregate]\ndirectory = '/tmp'\n", ["directory"]),
    "seed is a string": (RECIPE_OK.replace("seed = 1", 'seed = "one"'), ["seed"]),
    "chunk_size is a float": (RECIPE_OK.replace("chunk_size = 8", "chunk_size = 8.5"), ["chunk_size"]),
    "weight is a string": (RECIPE_OK + 'weight = "heavy"\n', ["weight"]),
    "weight is negative": (RECIPE_OK + "weight = -1.0\n", ["sources[0].weight"]),
    "weight is nan": (RECIPE_OK + "weight = nan\n", ["sources[0].weight"]),
    "sources is a table": ('seed = 1\n[sources]\npath = "a.jsonl"\n', ["sources"]),
    "no sources": ("seed = 1\n", ["sources"]),
    "source without path": ("[[sources]]\nweight = 1.0\n", ["sources[0].path"]),
    "unknown format": (RECIPE_OK + 'format = "csv"\n', ["sources[0].format", "csv"]),
    "negative shuffle window": (RECIPE_OK + "[shuffle]\nwindow = -3\n", ["shuffle.window"]),
    "canonical_replicas is a list": (RECIPE_OK.replace("seed = 1", "canonical_replicas = [8]"), ["canonical_replicas"]),
    "timeout is a string": (RECIPE_OK + "[aggregate]\ntimeout_s = 'soon'\n", ["timeout_s"]),
    "invalid TOML": (RECIPE_OK + "seed = = 3\n", ["invalid TOML", "line"]),
    "duplicate key": ("seed = 2\n" + RECIPE_OK, ["invalid TOML"]),
    "interpolation with an unknown resolver": (RECIPE_OK.replace('"docs.jsonl"', '"${eval:x}"'), ["sources[0].path", "eval"]),
    "interpolation with Python code": (RECIPE_OK.replace('"docs.jsonl"', '"${eval:__import__(\'os\').getpid()}"'), ["sources[0].path"]),
    "oc.env interpolation": (RECIPE_OK.replace('"docs.jsonl"', '"${oc.env:ZEPHON_REL_DIR}/docs.jsonl"'), None),
}


@pytest.mark.parametrize("name", list(RECIPE_CASES))
def test_bad_recipes_name_file_and_key(tmp_path, rel, name):
    text, words = RECIPE_CASES[name]
    (tmp_path / "docs.jsonl").write_text(GOOD * 20)
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    if words is None:
        # OmegaConf resolves its oc.env interpolation (a documented OmegaConf
        # feature: it reads an environment variable, it runs no code).
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("ZEPHON_REL_DIR", str(tmp_path))
            r = load_recipe(path)
        assert r.spec.sources[0].path == f"{tmp_path}/docs.jsonl"
        rel.case(f"recipe: {name}", "resolved from the environment (no code runs)")
        return
    with pytest.raises(ConfigError) as e:
        load_recipe(path).work_source()
    msg = str(e.value)
    assert str(path) in msg and all(w in msg for w in words), msg
    rel.case(f"recipe: {name}", "ConfigError naming file and key")


class CharTokenizer:
    zephon_identity = "reliability.CharTokenizer.v1"

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


# -- run_id ----------------------------------------------------------------------------
HOSTILE_RUN_IDS = ["", ".", "..", "/", "../x", "a/../../b", "x/y", "/abs", ".hidden", "~", "$HOME", "a b", "a\x00b", "a\nb",
                   "ünïcödé", "日本", "run\u202eid", "x" * 129, "x" * 10000, "s3://bucket/k", "C:\\x", None, 7, b"bytes"]


@pytest.mark.parametrize("run_id", HOSTILE_RUN_IDS, ids=lambda v: repr(v)[:24])
def test_hostile_run_ids_are_refused(tmp_path, rel, run_id):
    agg = tmp_path / "agg"
    with pytest.raises(ConfigError) as e:
        relkit.pipeline(world_size=2, global_rank=0, aggregate_dir=str(agg), run_id=run_id)
    msg = str(e.value)
    assert "run_id" in msg and len(msg) < 400, msg
    assert not any(tmp_path.rglob("*")), "something was created"
    rel.case(f"run_id {repr(run_id)[:30]}", "ConfigError naming run_id")


def test_longest_legal_run_id_stays_inside_aggregate_dir(tmp_path, rel):
    agg = tmp_path / "agg"
    run_id = "a-" + "b" * 124 + ".c"
    assert len(run_id) == 128
    p = relkit.pipeline(world_size=1, aggregate_dir=str(agg), run_id=run_id)
    p.close()
    # through a recipe too
    (tmp_path / "docs.jsonl").write_text(GOOD * 20)
    (tmp_path / "r.toml").write_text(RECIPE_OK + '[aggregate]\ndir = "agg"\nrun_id = "../escape"\n')
    with pytest.raises(ConfigError) as e:
        load_recipe(tmp_path / "r.toml").build(seq_len=8, batch_size=2, tokenizer=CharTokenizer(), world_size=2, global_rank=0)
    assert "run_id" in str(e.value)
    assert not (tmp_path / "escape").exists()
    rel.case("run_id of 128 legal characters; '../escape' from a recipe", "accepted / ConfigError")


# -- checkpoints with extra, missing or mistyped fields -----------------------------------
def _merged_state() -> dict:
    p = relkit.pipeline(prefetch=0)
    it = iter(p)
    for _ in range(6):
        next(it)
    st = json.loads(json.dumps(p.checkpoint()))
    p.close()
    return st


def _mutations(state: dict):
    """(name, mutate(state), words the error must contain)."""
    yield "extra top-level field", lambda s: s.update(extra=1), ["unknown field", "extra"]
    for key in ("format", "version", "fingerprint", "definition", "canonical_replicas", "topology", "lanes"):
        yield f"missing {key}", lambda s, k=key: s.pop(k), ["missing", key]
    yield "format wrong", lambda s: s.update(format="zephon.other"), ["format"]
    yield "version 99", lambda s: s.update(version=99), ["version"]
    yield "version as string", lambda s: s.update(version="1"), ["version"]
    yield "canonical_replicas string", lambda s: s.update(canonical_replicas="4"), ["canonical_replicas"]
    yield "canonical_replicas 0", lambda s: s.update(canonical_replicas=0), ["canonical_replicas"]
    yield "canonical_replicas bool", lambda s: s.update(canonical_replicas=True), ["canonical_replicas"]
    yield "canonical_replicas differs", lambda s: s.update(canonical_replicas=8), ["canonical_replicas"]
    yield "topology a list", lambda s: s.update(topology=[1]), ["topology"]
    yield "lanes a list", lambda s: s.update(lanes=[]), ["lanes"]
    yield "definition a string", lambda s: s.update(definition="x"), ["definition"]
    yield "fingerprint altered", lambda s: s.update(fingerprint="0" * 64), ["fingerprint"]
    yield "definition altered", lambda s: s["definition"]["work_source"].update(seed=8), ["fingerprint"]
    yield "definition consistent but other data", lambda s: _refingerprint(s), ["seed"]
    for lane in sorted(state["lanes"]):
        yield f"lane {lane} missing", lambda s, l=lane: s["lanes"].pop(l), ["lane", f"[{lane}]"]
    yield "lane 9 beyond C", lambda s: s["lanes"].update({"9": s["lanes"]["0"]}), ["lanes['9']"]
    yield "lane key not a number", lambda s: s["lanes"].update({"x": s["lanes"]["0"]}), ["lanes['x']"]
    yield "lane extra field", lambda s: s["lanes"]["1"].update(extra=0), ["lanes['1']"]
    yield "lane without delivered", lambda s: s["lanes"]["1"].pop("delivered"), ["lanes['1']"]
    yield "lane without cursor", lambda s: s["lanes"]["2"].pop("cursor"), ["lanes['2']"]
    for n, bad in enumerate(["3", 1.5, -1, None, True, [1]]):
        yield f"cursor[{n % 4}] = {bad!r}", lambda s, n=n, b=bad: s["lanes"]["3"]["cursor"].__setitem__(n % 4, b), ["lanes['3'].cursor"]
    yield "cursor of 3 entries", lambda s: s["lanes"]["0"]["cursor"].pop(), ["lanes['0'].cursor"]
    yield "cursor of 5 entries", lambda s: s["lanes"]["0"]["cursor"].append(0), ["lanes['0'].cursor"]
    yield "delivered negative", lambda s: s["lanes"]["0"].update(delivered=-2), ["lanes['0'].delivered"]
    yield "delivered float", lambda s: s["lanes"]["0"].update(delivered=2.0), ["lanes['0'].delivered"]
    yield "delivered a string", lambda s: s["lanes"]["0"].update(delivered="12"), ["lanes['0'].delivered"]


def _refingerprint(s: dict) -> None:
    from zephon_core.checkpoint.state import fingerprint_of

    s["definition"]["work_source"]["seed"] = 8
    s["fingerprint"] = fingerprint_of(s["definition"])


def test_checkpoints_with_extra_missing_or_mistyped_fields(rel):
    base = _merged_state()
    failures = []
    n = 0
    for name, mutate, words in _mutations(base):
        st = json.loads(json.dumps(base))
        mutate(st)
        st = json.loads(json.dumps(st))  # as read back from a file
        n += 1
        try:
            relkit.pipeline(prefetch=0).restore(st)
        except StateError as e:
            msg = str(e)
            sealed = "digest" in base and "digest" in msg  # a state sealed by a checksum may be refused by it first
            if not sealed and not all(w in msg for w in words):
                failures.append(f"{name}: message {msg[:200]!r} does not name {words}")
            continue
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: {type(e).__name__}: {e}")
            continue
        failures.append(f"{name}: accepted")
    rel.case(f"checkpoint field mutations ({n})", "StateError naming the field" if not failures else f"FAILED: {failures}")
    assert not failures, "\n".join(failures)
