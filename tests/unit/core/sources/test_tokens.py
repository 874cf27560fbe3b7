"""NumPy token arrays (``token_array``): documents and flat reads, bad offsets and tokens, the fingerprint."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_core import DataError, TokenArraySource


def _random_order(n, seed=0):
    return np.random.default_rng(seed).permutation(n).tolist()


def _docs():
    return [np.arange(10 * d, 10 * d + (d % 5)) for d in range(30)]  # includes empty documents


def _save_tokens(tmp_path, docs, dtype=np.uint16):
    tokens = np.concatenate(docs).astype(dtype)
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    np.save(tmp_path / "tok.npy", tokens)
    np.save(tmp_path / "off.npy", offsets)
    return str(tmp_path / "tok.npy"), str(tmp_path / "off.npy")


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64])
def test_token_array_reads_documents(tmp_path, dtype):
    docs = _docs()
    src = TokenArraySource(*_save_tokens(tmp_path, docs, dtype))
    assert len(src) == 30
    order = _random_order(30)
    for i, got in zip(order, src.read(order)):
        assert got.dtype == np.int64
        assert np.array_equal(got, docs[i])
    assert src.fingerprint()["dtype"] == np.dtype(dtype).name


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64])
def test_token_array_read_flat_is_read_end_to_end(tmp_path, dtype):
    docs = _docs()
    in_memory = TokenArraySource(np.concatenate(docs).astype(dtype), np.cumsum([0] + [len(d) for d in docs]))
    for src in (TokenArraySource(*_save_tokens(tmp_path, docs, dtype)), in_memory):
        for order in ([5], [0, 5, 5, 29], _random_order(30), []):
            tokens, lengths = src.read_flat(np.asarray(order, dtype=np.int64))
            want = src.read(order)
            assert tokens.dtype == np.int64 and lengths.tolist() == [len(w) for w in want]
            assert np.array_equal(tokens, np.concatenate(want) if want else np.zeros(0, np.int64))


def test_token_array_in_memory_arrays():
    src = TokenArraySource(np.array([5, 6, 7, 8]), np.array([0, 1, 4]))
    assert [d.tolist() for d in src.read([1, 0])] == [[6, 7, 8], [5]]
    assert src.fingerprint() != TokenArraySource(np.array([5, 6, 7, 9]), np.array([0, 1, 4])).fingerprint()


@pytest.mark.parametrize(
    "offsets, words",
    [
        ([1, 2, 4], ["start at 0"]),
        ([0, 3, 2, 4], ["decrease"]),
        ([0, 2, 3], ["token count 4"]),
        ([0, 2, 5], ["token count 4"]),
        ([0], ["at least 2"]),
        ([[0, 4]], ["1-D"]),
    ],
)
def test_token_array_bad_offsets(tmp_path, offsets, words):
    np.save(tmp_path / "tok.npy", np.arange(4, dtype=np.int32))
    np.save(tmp_path / "off.npy", np.asarray(offsets, dtype=np.int64))
    with pytest.raises(DataError) as e:
        TokenArraySource(str(tmp_path / "tok.npy"), str(tmp_path / "off.npy"))
    assert "off.npy" in str(e.value)
    for w in words:
        assert w in str(e.value)


def test_token_array_float_offsets_are_refused(tmp_path):
    """Offsets must be integers: 2.5 must not silently become 2."""
    np.save(tmp_path / "tok.npy", np.arange(5, dtype=np.int32))
    np.save(tmp_path / "off.npy", np.array([0.0, 2.5, 5.0]))
    with pytest.raises(DataError, match="integer"):
        TokenArraySource(str(tmp_path / "tok.npy"), str(tmp_path / "off.npy"))


@pytest.mark.parametrize("tokens", [np.zeros(4, dtype=np.float32), np.zeros((2, 2), dtype=np.int32)])
def test_token_array_bad_tokens(tmp_path, tokens):
    np.save(tmp_path / "tok.npy", tokens)
    np.save(tmp_path / "off.npy", np.array([0, 4]))
    with pytest.raises(DataError) as e:
        TokenArraySource(str(tmp_path / "tok.npy"), str(tmp_path / "off.npy"))
    assert "tok.npy" in str(e.value)


def test_token_array_unreadable_files(tmp_path):
    np.save(tmp_path / "off.npy", np.array([0, 4]))
    with pytest.raises(DataError, match="tok.npy"):
        TokenArraySource(str(tmp_path / "tok.npy"), str(tmp_path / "off.npy"))
    (tmp_path / "tok.npy").write_bytes(b"garbage")
    with pytest.raises(DataError, match="tok.npy"):
        TokenArraySource(str(tmp_path / "tok.npy"), str(tmp_path / "off.npy"))
    np.save(tmp_path / "obj.npy", np.array([[1], "x"], dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match="obj.npy"):
        TokenArraySource(str(tmp_path / "obj.npy"), str(tmp_path / "off.npy"))


def test_token_array_fingerprint_ignores_location(tmp_path):
    docs = _docs()
    a = TokenArraySource(*_save_tokens(tmp_path, docs))
    other = tmp_path / "elsewhere"
    other.mkdir()
    b = TokenArraySource(*_save_tokens(other, docs))
    c_dir = tmp_path / "changed"
    c_dir.mkdir()
    c = TokenArraySource(*_save_tokens(c_dir, docs[::-1]))
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != c.fingerprint()
