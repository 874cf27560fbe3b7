"""Parquet: random reads across row groups, its text column and errors; Parquet and JSONL from an fsspec URL."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_core import DataError, JsonlSource, ParquetSource, TokenArraySource

TEXTS = [f"document {i} " + "é→😀"[i % 3] * (i % 5) for i in range(40)]


def _random_order(n, seed=0):
    return np.random.default_rng(seed).permutation(n).tolist()


def _write_parquet(path, columns, row_group_size=7, schema=None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(columns, schema=schema)
    pq.write_table(table, str(path), row_group_size=row_group_size)
    return path


def test_parquet_random_reads_across_row_groups(tmp_path):
    import pyarrow.parquet as pq

    path = _write_parquet(tmp_path / "d.parquet", {"text": TEXTS, "n": list(range(len(TEXTS)))})
    assert pq.ParquetFile(str(path)).metadata.num_row_groups == 6
    src = ParquetSource(str(path))
    assert len(src) == len(TEXTS)
    for seed in range(3):
        order = _random_order(len(TEXTS), seed)
        assert src.read(order) == [TEXTS[i] for i in order]
    assert src.read([39, 0, 39]) == [TEXTS[39], TEXTS[0], TEXTS[39]]


def test_parquet_other_text_field_and_large_string(tmp_path):
    import pyarrow as pa

    schema = pa.schema([("body", pa.large_string())])
    path = _write_parquet(tmp_path / "l.parquet", {"body": TEXTS[:10]}, row_group_size=3, schema=schema)
    assert ParquetSource(str(path), text_field="body").read([9, 2]) == [TEXTS[9], TEXTS[2]]


def test_parquet_missing_column(tmp_path):
    path = _write_parquet(tmp_path / "m.parquet", {"body": TEXTS})
    with pytest.raises(DataError) as e:
        ParquetSource(str(path))
    assert str(path) in str(e.value) and "'text'" in str(e.value) and "body" in str(e.value)


def test_parquet_non_string_column(tmp_path):
    path = _write_parquet(tmp_path / "n.parquet", {"text": list(range(10))})
    with pytest.raises(DataError) as e:
        ParquetSource(str(path))
    assert str(path) in str(e.value) and "string" in str(e.value) and "int64" in str(e.value)


def test_parquet_null_value(tmp_path):
    values = ["a", "b", None, "d"]
    path = _write_parquet(tmp_path / "null.parquet", {"text": values}, row_group_size=2)
    src = ParquetSource(str(path))
    assert src.read([3, 0]) == ["d", "a"]
    with pytest.raises(DataError) as e:
        src.read([1, 2])
    assert str(path) in str(e.value) and "row 2" in str(e.value) and "null" in str(e.value)


def test_parquet_not_a_parquet_file(tmp_path):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"PAR1 but not really")
    with pytest.raises(DataError, match="Parquet"):
        ParquetSource(str(path))


def test_parquet_fingerprint_changes_with_content(tmp_path):
    a = ParquetSource(str(_write_parquet(tmp_path / "a.parquet", {"text": TEXTS}))).fingerprint()
    b = ParquetSource(str(_write_parquet(tmp_path / "b.parquet", {"text": TEXTS[::-1]}))).fingerprint()
    assert a != b


def test_jsonl_and_parquet_from_an_fsspec_url(tmp_path):
    import uuid

    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = f"memory://zephon-unit-{uuid.uuid4().hex}"
    with fsspec.open(f"{root}/docs.jsonl", "wb") as f:
        f.write("".join(f'{{"text": "{t}"}}\n' for t in ["m0", "m1", "m2"]).encode())
    src = JsonlSource(f"{root}/docs.jsonl")
    assert src.read([2, 0]) == ["m2", "m0"]
    assert JsonlSource(f"{root}/docs.jsonl").fingerprint() == src.fingerprint()
    with fsspec.open(f"{root}/d.parquet", "wb") as f:
        pq.write_table(pa.table({"text": TEXTS}), f, row_group_size=9)
    assert ParquetSource(f"{root}/d.parquet").read([31, 2]) == [TEXTS[31], TEXTS[2]]
    with fsspec.open(f"{root}/t.npy", "wb") as f:
        np.save(f, np.arange(4))
    with pytest.raises(DataError, match="local"):
        TokenArraySource(f"{root}/t.npy", f"{root}/t.npy")
    fsspec.filesystem("memory").rm(root.replace("memory://", "/"), recursive=True)
