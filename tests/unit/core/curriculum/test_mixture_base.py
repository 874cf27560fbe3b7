"""zephon_core.curriculum.mixture_base: a static mixture is a staged one of one document-weighted stage.

Their definitions differ by design (each keeps its ``kind`` and form, so no fingerprint moves):
what must agree is the data, the same documents in the same order, chunk by chunk and batch by batch.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from support.core_fixtures import token_pipeline, token_source

from zephon_core import Stage, StagedMixture, StaticMixture
from zephon_core.curriculum.mixture_base import Mixture, largest_remainder


@st.composite
def static_mixtures(draw):
    n = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    weights = draw(st.lists(st.one_of(st.integers(1, 9), st.floats(0.25, 5.0)), min_size=n, max_size=n))
    chunk_size = draw(st.integers(n, 48))
    assume(min(largest_remainder(weights, chunk_size)) > 0)  # every weight gets a document of every chunk
    shuffle = draw(st.booleans())
    blocks = draw(st.one_of(st.none(), st.integers(1, 7))) if shuffle else None
    exhausted = draw(st.sampled_from(["repeat", "stop"]))
    kw = dict(seed=draw(st.integers(0, 2**31)), chunk_size=chunk_size, exhausted=exhausted, shuffle=shuffle,
              block_size=blocks, block_window=draw(st.integers(1, 4)))
    return sizes, weights, kw


@settings(max_examples=40, deadline=None)
@given(static_mixtures())
def test_a_static_mixture_delivers_what_its_one_stage_staged_mixture_does(case):
    sizes, weights, kw = case
    sources = [token_source(n, s) for s, n in enumerate(sizes)]
    static = StaticMixture(sources, weights, **kw)
    staged = StagedMixture(sources, [Stage({s.name: w for s, w in zip(sources, weights)})], **kw)
    assert isinstance(static, Mixture) and isinstance(staged, Mixture)
    assert static.num_chunks == staged.num_chunks and static.chunks_per_epoch == staged.chunks_per_epoch
    gs = list(range(min(static.num_chunks or 50, 50))) + [static.num_chunks or 1000]
    for a, b in zip(static.chunks(gs), staged.chunks(gs)):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.index == b.index
            assert np.array_equal(a.sources, b.sources) and np.array_equal(a.documents, b.documents)
    if static.num_chunks is None:  # the data delivered, batch by batch, with its provenance
        pa, pb = token_pipeline(static, canonical_replicas=2), token_pipeline(staged, canonical_replicas=2)
        ita, itb = iter(pa), iter(pb)
        for _ in range(4):
            x, y = next(ita), next(itb)
            assert x.digest == y.digest and np.array_equal(x.segments, y.segments)
        pa.close()
        pb.close()
