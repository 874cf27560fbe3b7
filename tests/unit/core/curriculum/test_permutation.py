"""zephon_core.curriculum.permutation: stateless bijections of [0, n)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core.curriculum.permutation import (
    IndexPermutation,
    _feistel,
    _feistel_by_table,
    _round_tables,
    derive_key,
    derive_keys,
    feistel_domain,
    permute_ragged,
    round_keys,
    round_keys_array,
)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 15, 16, 17, 64, 1000, 4097])
@pytest.mark.parametrize("key", [0, 1, 2**63 + 5])
def test_is_a_bijection(n, key):
    perm = IndexPermutation(n, key)
    out = perm.take(np.arange(n))
    assert out.dtype == np.int64
    assert out.shape == (n,)
    assert sorted(out.tolist()) == list(range(n))
    assert len(perm) == n


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(n=st.integers(1, 3000), key=st.integers(0, 2**64 - 1))
def test_is_a_bijection_property(n, key):
    out = IndexPermutation(n, key).take(np.arange(n))
    assert np.array_equal(np.sort(out), np.arange(n))


def test_getitem_matches_take_in_any_order():
    perm = IndexPermutation(1000, 99)
    full = perm.take(np.arange(1000))
    rng = np.random.default_rng(0)
    idx = rng.permutation(1000)[:200]
    assert np.array_equal(perm.take(idx), full[idx])
    assert [perm[int(i)] for i in idx[:20]] == full[idx[:20]].tolist()
    assert perm.take([]).size == 0


def test_same_key_same_order_across_instances():
    a = IndexPermutation(4097, 7).take(np.arange(4097))
    b = IndexPermutation(4097, 7).take(np.arange(4097))
    assert np.array_equal(a, b)


@pytest.mark.parametrize("n", [7, 1000, 4097])
def test_different_keys_give_different_orders(n):
    orders = {tuple(IndexPermutation(n, k).take(np.arange(n)).tolist()) for k in range(12)}
    assert len(orders) == 12


def test_it_actually_shuffles():
    out = IndexPermutation(1000, 5).take(np.arange(1000))
    # A good permutation fixes about one point and is far from sorted.
    assert int(np.sum(out == np.arange(1000))) < 20
    assert abs(np.corrcoef(out, np.arange(1000))[0, 1]) < 0.2


@pytest.mark.parametrize("n", [1, 2, 7, 1000])
@pytest.mark.parametrize("bad", [-1, "n", 10**6])
def test_take_out_of_range_raises(n, bad):
    perm = IndexPermutation(n, 3)
    index = n if bad == "n" else bad
    with pytest.raises(IndexError):
        perm.take([0, index])
    with pytest.raises(IndexError):
        perm[index]


@pytest.mark.parametrize("n", [0, -3])
def test_empty_range_is_refused(n):
    with pytest.raises(ValueError):
        IndexPermutation(n, 1)


def test_huge_domain_is_O1_and_injective_on_a_sample():
    n = 3 * 2**40 + 17
    perm = IndexPermutation(n, 11)
    idx = np.arange(0, n, n // 5000, dtype=np.int64)[:5000]
    out = perm.take(idx)
    assert out.min() >= 0 and out.max() < n
    assert len(np.unique(out)) == len(idx)


def test_derive_key_is_stable_and_sensitive():
    assert derive_key("epoch", 1, 2) == derive_key("epoch", 1, 2)
    assert derive_key("epoch", 1, 2) != derive_key("epoch", 1, 3)
    assert derive_key("epoch", 1, 2) != derive_key("epoch", 12)
    assert 0 <= derive_key("x") < 2**64


def test_golden_values_pin_checkpoint_compatibility():
    """Checkpoints replay data from these functions: they must never change between versions."""
    assert derive_key("golden", 1) == 2039803363940230706
    assert IndexPermutation(10, 12345).take(np.arange(10)).tolist() == [5, 1, 8, 7, 9, 4, 0, 6, 3, 2]


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(sizes=st.lists(st.integers(2, 700), min_size=1, max_size=6), data=st.data())
def test_permute_ragged_equals_one_permutation_per_size(sizes, data):
    domain = feistel_domain(sizes[0])
    sizes = [n for n in sizes if feistel_domain(n) == domain]
    keys = [data.draw(st.integers(0, 2**64 - 1)) for _ in sizes]
    flat = permute_ragged(sizes, keys)
    assert flat.dtype == np.int64 and len(flat) == sum(sizes)
    out = np.split(flat, np.cumsum(sizes)[:-1])
    assert all(np.array_equal(o, IndexPermutation(n, k).take(np.arange(n))) for o, n, k in zip(out, sizes, keys))


@given(st.lists(st.one_of(st.integers(), st.text(max_size=5)), max_size=3), st.lists(st.one_of(st.integers(), st.text(max_size=5)), max_size=5))
def test_derive_keys_are_derive_key_with_the_shared_parts_first(parts, lasts):
    assert derive_keys(parts, lasts) == [derive_key(*parts, x) for x in lasts]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 5000), key=st.integers(0, 2**64 - 1), data=st.data())
def test_a_permutation_read_from_round_tables_is_the_computed_one(n, key, data):
    # take() of many indices switches to tables of the round functions; a few indices on a
    # fresh permutation are computed round by round. Both must give the same bijection.
    whole = IndexPermutation(n, key).take(np.arange(n))
    assert sorted(whole.tolist()) == list(range(n))
    some = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3))
    assert IndexPermutation(n, key).take(some).tolist() == whole[some].tolist()
    p = IndexPermutation(n, key)
    x = np.arange((int(p._mask) + 1) ** 2, dtype=np.uint64)  # the whole Feistel domain
    with np.errstate(over="ignore"):
        by_rounds = _feistel(x, p._half_bits, p._mask, p._round_keys)
        by_table = _feistel_by_table(x, p._half_bits, p._mask, _round_tables(p._half_bits, p._mask, p._round_keys))
    assert np.array_equal(by_rounds, by_table)


@given(st.lists(st.integers(0, 2**64 - 1), max_size=6))
def test_round_keys_array_holds_each_keys_round_keys(keys):
    got = round_keys_array(keys)
    assert got.dtype == np.uint64 and got.shape == (len(keys), len(round_keys(0)))
    assert got.tolist() == [[derive_key(k, r) for r in range(len(round_keys(0)))] for k in keys]


def test_permute_ragged_refuses_sizes_of_different_domains():
    with pytest.raises(ValueError, match="one Feistel domain"):
        permute_ragged([10, 300], [1, 2])


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_round_keys_are_derive_keys_of_each_round(key):
    from zephon_core.curriculum.permutation import _ROUNDS, round_keys

    assert round_keys(key) == [derive_key(key, r) for r in range(_ROUNDS)]


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=1, max_value=5000), st.integers(min_value=0, max_value=2**63), st.lists(st.integers(min_value=0, max_value=10**6), max_size=50))
def test_an_epoch_kept_as_a_table_maps_positions_as_the_permutation_does(n, seed, positions):
    import zephon_core.curriculum.order as order

    p = np.asarray(positions, dtype=np.int64)
    tabled = order.EpochPermutation(n, seed, 0).documents(p)
    saved = order.EPOCH_TABLE_MAX
    order.EPOCH_TABLE_MAX = 0  # every epoch through the Feistel network
    try:
        direct = order.EpochPermutation(n, seed, 0).documents(p)
    finally:
        order.EPOCH_TABLE_MAX = saved
    assert tabled.tolist() == direct.tolist()
