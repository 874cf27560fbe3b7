"""zephon_core.curriculum.mixture.StaticMixture: the curriculum as a pure function of the chunk number."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.core_fixtures import mixture, token_source

from zephon_core import ConfigError, MemorySource, StaticMixture
from zephon_core.curriculum.mixture import largest_remainder


def _pairs(chunk):
    return list(zip(chunk.sources.tolist(), chunk.documents.tolist()))


# -- purity -------------------------------------------------------------------
def test_chunk_is_a_pure_function_of_g():
    a = mixture((37, 23, 11), [0.5, 0.3, 0.2], seed=9, chunk_size=10)
    b = mixture((37, 23, 11), [0.5, 0.3, 0.2], seed=9, chunk_size=10)
    forward = [_pairs(a.chunk(g)) for g in range(30)]
    rng = np.random.default_rng(1)
    order = rng.permutation(30)
    backward = {int(g): _pairs(b.chunk(int(g))) for g in order}
    assert [backward[g] for g in range(30)] == forward
    # Asking again, after other chunks, gives the same answer.
    assert _pairs(a.chunk(4)) == forward[4]
    assert a.chunk(1000).index == 1000
    assert _pairs(a.chunk(1000)) == _pairs(b.chunk(1000))


def test_seed_changes_the_curriculum():
    a = [_pairs(mixture((50,), seed=1, chunk_size=10).chunk(g)) for g in range(5)]
    b = [_pairs(mixture((50,), seed=2, chunk_size=10).chunk(g)) for g in range(5)]
    assert a != b


def test_negative_chunk_is_an_error():
    with pytest.raises(IndexError):
        mixture().chunk(-1)


# -- weights -> counts --------------------------------------------------------
@pytest.mark.parametrize(
    "weights, chunk_size, expected",
    [
        ([0.5, 0.3, 0.2], 10, [5, 3, 2]),
        ([1, 1, 1], 10, [4, 3, 3]),  # ties go to the lower index
        ([2, 1], 7, [5, 2]),  # 4.67 / 2.33
        ([1, 2], 7, [2, 5]),
        ([0.1, 0.45, 0.45], 8, [1, 4, 3]),  # 0.8/3.6/3.6: floors 0,3,3; remainders 0.8,0.6,0.6
        ([3], 5, [5]),
    ],
)
def test_per_source_counts_follow_largest_remainder(weights, chunk_size, expected):
    m = mixture([1000] * len(weights), weights, chunk_size=chunk_size)
    assert m.counts == expected
    for g in (0, 1, 17, 123):
        c = m.chunk(g)
        assert len(c) == chunk_size
        got = Counter(c.sources.tolist())
        assert [got.get(s, 0) for s in range(len(weights))] == expected


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    weights=st.lists(st.floats(0.01, 100.0, allow_nan=False), min_size=1, max_size=6),
    total=st.integers(1, 500),
)
def test_largest_remainder_properties(weights, total):
    counts = largest_remainder(weights, total)
    assert sum(counts) == total
    s = math.fsum(weights)
    for w, c in zip(weights, counts):
        assert abs(c - w / s * total) < 1 + 1e-9


# -- coverage -----------------------------------------------------------------
def test_every_document_once_per_epoch_aligned():
    # 30 docs at 6/chunk and 20 docs at 4/chunk: one epoch each per 5 chunks.
    m = mixture((30, 20), [0.6, 0.4], seed=4, chunk_size=10)
    for e in range(3):
        seen = {0: [], 1: []}
        for g in range(5 * e, 5 * e + 5):
            for s, d in _pairs(m.chunk(g)):
                seen[s].append(d)
        assert sorted(seen[0]) == list(range(30))
        assert sorted(seen[1]) == list(range(20))
    # Each epoch has a fresh permutation: the k-th chunk of each epoch holds other documents.
    def docs_of(g, s):
        return frozenset(d for src, d in _pairs(m.chunk(g)) if src == s)

    for s in (0, 1):
        for k in range(5):
            assert len({docs_of(k + 5 * e, s) for e in range(4)}) == 4, (s, k)


def test_every_document_once_per_epoch_across_chunk_boundaries():
    # 7 docs, 3 per chunk: epochs end in the middle of chunks; 7 chunks = 3 epochs.
    m = StaticMixture([token_source(7)], seed=5, chunk_size=3)
    docs = [d for g in range(7) for _, d in _pairs(m.chunk(g))]
    assert Counter(docs) == {d: 3 for d in range(7)}
    # The first 2 chunks + 1 doc hold epoch 0's first 7 positions: nothing twice among the first 6.
    assert len(set(docs[:6])) == 6


def test_shuffle_false_reads_in_file_order():
    m = StaticMixture([token_source(10)], seed=5, chunk_size=4, shuffle=False)
    assert m.chunk(0).documents.tolist() == [0, 1, 2, 3]
    assert m.chunk(2).documents.tolist() == [8, 9, 0, 1]
    two = StaticMixture([token_source(10, 0), token_source(10, 1)], [1, 1], seed=5, chunk_size=4, shuffle=False)
    assert _pairs(two.chunk(1)) == [(0, 2), (0, 3), (1, 2), (1, 3)]


def test_shuffle_true_interleaves_sources_within_a_chunk():
    m = mixture((1000, 1000), [1, 1], seed=8, chunk_size=32)
    blocks = [m.chunk(g).sources.tolist() for g in range(5)]
    assert any(b != sorted(b) for b in blocks)


# -- exhaustion ---------------------------------------------------------------
def test_stop_policy_ends_at_the_limiting_source_without_dropping_it():
    m = mixture((11, 100), [1, 1], seed=2, chunk_size=4, exhausted="stop")
    assert m.counts == [2, 2]
    assert m.num_chunks == 6  # ceil(11 / 2)
    chunks = [m.chunk(g) for g in range(6)]
    assert m.chunk(6) is None and m.chunk(50) is None
    a = [d for c in chunks for s, d in _pairs(c) if s == 0]
    b = [d for c in chunks for s, d in _pairs(c) if s == 1]
    assert sorted(a) == list(range(11))  # every document of the limiting source, once
    assert len(b) == 12 and len(set(b)) == 12  # the other one is not repeated
    assert len(chunks[-1]) == 3  # the last chunk is partial: 1 + 2


def test_stop_policy_exact_multiple():
    m = mixture((10, 30), [1, 3], seed=2, chunk_size=4, exhausted="stop")
    assert m.counts == [1, 3]
    assert m.num_chunks == 10
    assert all(len(m.chunk(g)) == 4 for g in range(10))
    assert m.chunk(10) is None


def test_repeat_policy_is_infinite():
    m = mixture((5,), chunk_size=4)
    assert m.num_chunks is None
    assert len(m.chunk(10**9)) == 4


# -- validation ---------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), float("-inf"), True, False, "1", None])
def test_bad_weight_names_source_index_and_name(bad):
    sources = [token_source(10, 0, name="alpha"), token_source(10, 1, name="beta")]
    with pytest.raises(ConfigError) as e:
        StaticMixture(sources, [1.0, bad], chunk_size=8)
    assert "weights[1]" in str(e.value)
    assert "beta" in str(e.value)


@pytest.mark.parametrize("weights", [[1.0], [1.0, 1.0, 1.0], []])
def test_wrong_number_of_weights(weights):
    with pytest.raises(ConfigError, match="weights"):
        StaticMixture([token_source(10, 0), token_source(10, 1)], weights)


def test_weight_too_small_for_chunk_size():
    sources = [token_source(10, 0, name="big"), token_source(10, 1, name="tiny")]
    with pytest.raises(ConfigError) as e:
        StaticMixture(sources, [1.0, 0.01], chunk_size=10)
    msg = str(e.value)
    assert "weights[1]" in msg and "tiny" in msg and "chunk_size" in msg
    # The suggested chunk_size is enough.
    StaticMixture(sources, [1.0, 0.01], chunk_size=101)


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"chunk_size": 0}, "chunk_size"),
        ({"chunk_size": True}, "chunk_size"),
        ({"chunk_size": 2.5}, "chunk_size"),
        ({"exhausted": "cycle"}, "exhausted"),
        ({"seed": 1.5}, "seed"),
        ({"seed": True}, "seed"),
    ],
)
def test_bad_arguments(kwargs, word):
    with pytest.raises(ConfigError, match=word):
        StaticMixture([token_source(10)], **kwargs)


def test_no_sources():
    with pytest.raises(ConfigError):
        StaticMixture([])


def test_definition_captures_everything_that_defines_the_data():
    base = mixture((20, 20), [1, 2], seed=1, chunk_size=6).definition()
    assert base == mixture((20, 20), [1, 2], seed=1, chunk_size=6).definition()
    for other in (
        mixture((20, 20), [1, 3], seed=1, chunk_size=6),
        mixture((20, 20), [1, 2], seed=2, chunk_size=6),
        mixture((20, 20), [1, 2], seed=1, chunk_size=9),
        mixture((20, 21), [1, 2], seed=1, chunk_size=6),
        mixture((20, 20), [1, 2], seed=1, chunk_size=6, shuffle=False),
        mixture((20, 20), [1, 2], seed=1, chunk_size=6, exhausted="stop"),
    ):
        assert other.definition() != base
    # Content, not only size.
    a = StaticMixture([MemorySource([[1, 2], [3]])]).definition()
    b = StaticMixture([MemorySource([[1, 2], [4]])]).definition()
    assert a != b


def test_numpy_weights_and_seed_are_numbers():
    """Weights often come from NumPy; np.int64(1) is a positive finite number too."""
    import json

    sources = [token_source(10, 0), token_source(10, 1)]
    for weights in (np.array([1, 3]), np.array([0.25, 0.75], dtype=np.float32), [np.int64(1), np.int64(3)]):
        m = StaticMixture(sources, weights, seed=np.int64(3), chunk_size=8)
        assert m.counts == [2, 6]
        json.dumps(m.definition(), allow_nan=False)  # the checkpoint must stay JSON
