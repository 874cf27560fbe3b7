"""MegatronIndexedSource against megatron-core's own writer and reader.

Importing megatron-core costs several seconds, so every file here is written
once per module.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from zephon_core import DataError, MegatronIndexedSource

indexed_dataset = pytest.importorskip("megatron.core.datasets.indexed_dataset")
torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:Could not determine rank:UserWarning"),
]


def _documents(seed=0, n=25):
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(n):
        # Some documents are several sequences, one is empty.
        parts = [rng.integers(0, 60000, size=int(rng.integers(0 if d == 3 else 1, 30))) for _ in range(1 + d % 3)]
        docs.append(parts)
    return docs


def _build(prefix, dtype, docs):
    builder = indexed_dataset.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for d, parts in enumerate(docs):
        if d % 2 == 0:  # whole document at once
            flat = np.concatenate(parts)
            builder.add_document(torch.from_numpy(flat.astype(np.int64)), [len(p) for p in parts])
        else:  # sequence by sequence
            for p in parts:
                builder.add_item(torch.from_numpy(p.astype(np.int64)))
            builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron")
    out = {}
    for dtype in (np.uint16, np.int32):
        docs = _documents(seed=int(np.dtype(dtype).itemsize))
        prefix = _build(str(root / f"corpus_{np.dtype(dtype).name}"), dtype, docs)
        out[dtype] = (prefix, docs)
    return out


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_reader_agrees_with_megatron(datasets, dtype):
    prefix, docs = datasets[dtype]
    ours = MegatronIndexedSource(prefix)
    theirs = indexed_dataset.IndexedDataset(prefix)
    doc_index = np.asarray(theirs.document_indices)
    assert len(ours) == len(doc_index) - 1 == len(docs)
    order = np.random.default_rng(1).permutation(len(docs)).tolist()
    for d, got in zip(order, ours.read(order)):
        want = [np.asarray(theirs[s]) for s in range(doc_index[d], doc_index[d + 1])]
        want = np.concatenate(want).astype(np.int64) if want else np.zeros(0, np.int64)
        assert got.dtype == np.int64
        assert np.array_equal(got, want), f"document {d}"
        assert np.array_equal(got, np.concatenate(docs[d]).astype(np.int64))
    assert ours.fingerprint()["dtype"] == np.dtype(dtype).name
    assert ours.name == prefix.rsplit("/", 1)[-1]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_read_flat_is_read_end_to_end(datasets, dtype):
    """The packer's one-gather path returns exactly the documents ``read`` returns (repeats, empties, any order)."""
    prefix, docs = datasets[dtype]
    ours = MegatronIndexedSource(prefix)
    rng = np.random.default_rng(2)
    one_sequence = [d for d in range(len(docs)) if len(docs[d]) == 1]  # read by the one-sequence shortcut
    assert len(one_sequence) > 3
    for order in ([3], [3, 3, 0], one_sequence[::-1], rng.integers(0, len(docs), 40).tolist(), []):
        tokens, lengths = ours.read_flat(np.asarray(order, dtype=np.int64))
        want = [np.concatenate(docs[d]).astype(np.int64) for d in order]
        assert tokens.dtype == np.int64 and lengths.dtype == np.int64
        assert lengths.tolist() == [len(w) for w in want]
        assert np.array_equal(tokens, np.concatenate(want) if want else np.zeros(0, np.int64))


def _copy(prefix, tmp_path, name="c"):
    dst = str(tmp_path / name)
    shutil.copy(prefix + ".idx", dst + ".idx")
    shutil.copy(prefix + ".bin", dst + ".bin")
    return dst


def test_fingerprint_is_content_based(datasets, tmp_path):
    prefix, _ = datasets[np.int32]
    copy = _copy(prefix, tmp_path)
    assert MegatronIndexedSource(copy).fingerprint() == MegatronIndexedSource(prefix).fingerprint()
    other, _ = datasets[np.uint16]
    assert MegatronIndexedSource(other).fingerprint() != MegatronIndexedSource(prefix).fingerprint()


@pytest.mark.parametrize("cut", [1, 8, 100])
def test_truncated_idx(datasets, tmp_path, cut):
    prefix = _copy(datasets[np.int32][0], tmp_path)
    data = open(prefix + ".idx", "rb").read()
    open(prefix + ".idx", "wb").write(data[:-cut])
    with pytest.raises(DataError) as e:
        MegatronIndexedSource(prefix)
    assert prefix + ".idx" in str(e.value) and "truncated" in str(e.value)


def test_truncated_idx_header(datasets, tmp_path):
    prefix = _copy(datasets[np.int32][0], tmp_path)
    data = open(prefix + ".idx", "rb").read()
    open(prefix + ".idx", "wb").write(data[:20])
    with pytest.raises(DataError) as e:
        MegatronIndexedSource(prefix)
    assert prefix + ".idx" in str(e.value) and "header" in str(e.value)


@pytest.mark.parametrize("cut", [1, 2, 64])
def test_truncated_bin(datasets, tmp_path, cut):
    prefix = _copy(datasets[np.uint16][0], tmp_path)
    data = open(prefix + ".bin", "rb").read()
    open(prefix + ".bin", "wb").write(data[:-cut])
    with pytest.raises(DataError) as e:
        MegatronIndexedSource(prefix)
    assert prefix + ".bin" in str(e.value) and "truncated" in str(e.value)


def test_bad_magic_and_missing_files(datasets, tmp_path):
    prefix = _copy(datasets[np.int32][0], tmp_path)
    data = bytearray(open(prefix + ".idx", "rb").read())
    data[:4] = b"XXXX"
    open(prefix + ".idx", "wb").write(bytes(data))
    with pytest.raises(DataError, match="not a Megatron index"):
        MegatronIndexedSource(prefix)
    prefix2 = _copy(datasets[np.int32][0], tmp_path, "d")
    (tmp_path / "d.bin").unlink()
    with pytest.raises(DataError) as e:
        MegatronIndexedSource(prefix2)
    assert prefix2 + ".bin" in str(e.value)
    with pytest.raises(DataError) as e:
        MegatronIndexedSource(str(tmp_path / "absent"))
    assert "absent.idx" in str(e.value)
