"""Quarantine (issue #35): quarantined documents leave the lanes from each lane's first unread chunk, and the effect
is local. What moves, exactly: a lane that never reads a quarantined document after the quarantine delivers every
batch unchanged; a lane that does delivers the same batches up to the first that held one (in pad mode up to the
one holding the row before it, which closed because that document did not fit), and after it the same
documents in the same order less the quarantined ones (packing closes the gap, so later rows of that lane shift:
concat packing carries rows across chunk boundaries)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core import MemorySource, Pipeline, StaticMixture
from zephon_core.checkpoint.surgery import surgery_journal_of
from zephon_core.errors import ConfigError
from zephon_core.pipeline.surgery import quarantined_state
from zephon_core.verify.simulate import Phase, run_phase

DOCS = [[1 + i % 7] * (3 + i % 11) for i in range(90)]
C = 4


def _maker(mode: str):
    def make(dp_degree: int, dp_group_id: int) -> Pipeline:
        ws = StaticMixture([MemorySource(DOCS, name="m")], seed=9, chunk_size=5)
        return (Pipeline(ws).pack(8, mode=mode).batch(2)
                .options(canonical_replicas=C, dp_degree=dp_degree, dp_group_id=dp_group_id, prefetch=0))
    return make


def _lanes(make, G: int, steps: int, state):
    """Per lane: its batches after ``state`` as (lane_index, digest, the documents of its rows in order)."""
    out: dict[int, list] = {}
    def on_batch(_gid, b):
        docs = [int(d) for d in b.segments[:, 2]]
        out.setdefault(b.lane, []).append((b.lane_index, b.digest, docs))
    _, end = run_phase(make, Phase(G, steps), C, state, on_batch=on_batch)
    return out, end


def _order(batches) -> list[int]:
    """A lane's documents in delivery order, each once per stretch of consecutive rows it fills."""
    seq: list[int] = []
    for _, _, docs in batches:
        for d in docs:
            if not seq or seq[-1] != d:
                seq.append(d)
    return seq


@settings(max_examples=10, deadline=None)
@given(before=st.integers(0, 3), picks=st.lists(st.integers(0, 10 ** 6), min_size=1, max_size=3),
       G=st.sampled_from([1, 2, 4]), mode=st.sampled_from(["concat", "pad"]))
def test_a_quarantine_is_local_to_the_lanes_and_batches_that_held_its_documents(before, picks, G, mode):
    make = _maker(mode)
    _, state = run_phase(make, Phase(2, before), C, None) if before else (None, None)
    if state is None:
        _, state = run_phase(make, Phase(2, 0), C, None)
    reference, _ = _lanes(make, G, 8, state)
    # A document of a chunk a lane has begun to read stays there (refilled as it was); the quarantine takes the
    # later ones, so the picks come from documents no lane had begun to read.
    probe = quarantined_state(make(1, 0), json.loads(json.dumps(state)), [("m", 0)])
    starts = surgery_journal_of(probe).quarantines[0].from_chunks
    ws = make(1, 0).work_source
    early = {int(d) for lane in range(C) for k in range(starts[lane])
             for d in ws.chunks([lane + k * C])[0].documents}
    seen = sorted({d for batches in reference.values() for _, _, docs in batches for d in docs} - early)
    quarantined = {seen[p % len(seen)] for p in picks}
    q_state = quarantined_state(make(1, 0), json.loads(json.dumps(state)), [("m", d) for d in sorted(quarantined)])
    expected = [", ".join(f"m#{d}" for d in sorted(quarantined))]
    assert [str(q) for q in surgery_journal_of(q_state).quarantines] == expected
    got, end = _lanes(make, G, 8, q_state)
    for lane, ref in reference.items():
        held = [n for n, (_, _, docs) in enumerate(ref) if quarantined & set(docs)]
        first = held[0] if held else len(ref)
        if mode == "pad" and held:  # a pad row closes before a document that does not fit: the row before it too
            first = max(0, first - 1)
        assert got[lane][:first] == ref[:first]  # untouched up to the first batch that held one
        assert not quarantined & {d for _, _, docs in got[lane] for d in docs}
        kept = [d for d in _order(ref) if d not in quarantined]
        assert _order(got[lane])[:len(kept) - 2] == kept[:len(kept) - 2]  # same order, the gap closed
    assert surgery_journal_of(end) == surgery_journal_of(q_state)  # the quarantine travels in later states


def test_a_quarantine_of_a_document_the_source_does_not_have_is_refused_naming_it():
    make = _maker("concat")
    _, state = run_phase(make, Phase(2, 1), C, None)
    with pytest.raises(ConfigError, match=r"m#90: source 'm' has documents 0\.\.89"):
        quarantined_state(make(1, 0), state, [("m", 3), ("m", 90)])
    with pytest.raises(ConfigError, match="no source 'web'"):
        quarantined_state(make(1, 0), state, [("web", 3)])


@pytest.mark.parametrize("mode", ["concat", "pad"])
def test_documents_of_a_chunk_a_lane_has_begun_to_read_stay_where_they_were(mode):
    """A restore refills the chunk a lane stands in: quarantining its documents leaves it as it was delivered."""
    make = _maker(mode)
    _, state = run_phase(make, Phase(2, 1), C, None)
    reference, _ = _lanes(make, 2, 4, state)
    probe = quarantined_state(make(1, 0), json.loads(json.dumps(state)), [("m", 0)])
    starts = surgery_journal_of(probe).quarantines[0].from_chunks
    ws = make(1, 0).work_source
    early = {int(d) for lane in range(C) for k in range(starts[lane]) for d in ws.chunks([lane + k * C])[0].documents}
    got, _ = _lanes(make, 2, 4, quarantined_state(make(1, 0), json.loads(json.dumps(state)), [("m", d) for d in early]))
    kept = 0
    for lane, ref in reference.items():
        n = next((n for n, (_, _, docs) in enumerate(ref) if not set(docs) <= early), len(ref))
        assert got[lane][:n] == ref[:n]
        kept += n
    assert kept  # some batches were of chunks begun before the quarantine, and they are unchanged
