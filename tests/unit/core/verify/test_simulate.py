"""``zephon_core.verify``: the whole-topology simulation finds a changed step, runs a finite curriculum to its
end, and the curriculum audit passes an elastic run and names a repeated document."""

from __future__ import annotations

from zephon_core import MemorySource, Pipeline, StaticMixture
from zephon_core.verify.curriculum_audit import audit_curriculum, chunks_read
from zephon_core.verify.simulate import Phase, StepRecord, first_mismatch, run_phase, run_schedule

DOCS = [[1 + i % 7] * (3 + i % 5) for i in range(60)]


def _maker(seed: int = 0, exhausted: str = "repeat"):
    src = MemorySource(DOCS, name="m")

    def make(dp_degree: int, dp_group_id: int) -> Pipeline:
        ws = StaticMixture([src], seed=seed, chunk_size=4, exhausted=exhausted)
        return (Pipeline(ws).pack(8).batch(1, drop_last=False)
                .options(canonical_replicas=4, dp_degree=dp_degree, dp_group_id=dp_group_id, prefetch=0))
    return make


def _tokens(records: list[StepRecord]) -> list[tuple[int, int]]:
    """Every delivered ``(document, token)``, sorted."""
    return sorted((s.document, t) for r in records for row in r.segments for s in row for t in range(s.start, s.stop))


def test_a_resize_at_a_checkpoint_keeps_every_step_and_reads_each_chunk_once():
    reference, state = run_phase(_maker(), Phase(4, 6), 4, None)
    elastic = run_schedule(_maker(), [Phase(4, 2), Phase(2, 2), Phase(1, 2)], 4)
    assert first_mismatch(reference, elastic) is None
    ws = _maker()(1, 0).work_source
    assert not audit_curriculum(ws, chunks_read(state)).problems


def test_a_different_seed_is_found_at_its_first_step():
    reference, _ = run_phase(_maker(0), Phase(2, 3), 4, None)
    other, _ = run_phase(_maker(1), Phase(2, 3), 4, None)
    assert first_mismatch(reference, other) == 0


def test_a_phase_to_the_end_reads_a_finite_epoch_once_through_a_resize():
    first, state = run_phase(_maker(exhausted="stop"), Phase(4, 3), 4, None)
    rest, end = run_phase(_maker(exhausted="stop"), Phase(2, None), 4, state)
    assert rest and _tokens(first + rest) == sorted((d, t) for d, doc in enumerate(DOCS) for t in range(len(doc)))
    _, uninterrupted = run_phase(_maker(exhausted="stop"), Phase(1, None), 4, None)
    assert end["lanes"] == uninterrupted["lanes"]  # every lane ends where it ends without a resize
    again, _ = run_phase(_maker(exhausted="stop"), Phase(2, None), 4, end)
    assert again == []  # restored at the end, every group's data has ended


def test_a_fixed_phase_past_the_end_of_the_data_stops_there():
    to_end, _ = run_phase(_maker(exhausted="stop"), Phase(2, None), 4, None)
    past, _ = run_phase(_maker(exhausted="stop"), Phase(2, len(to_end) + 5), 4, None)
    assert past == to_end
    assert len(to_end[-1].digests) <= 4  # the last step may be short
