"""``zephon_core.verify``: the whole-topology simulation finds a changed step, and the curriculum audit
passes an elastic run and names a repeated document."""

from __future__ import annotations

from zephon_core import MemorySource, Pipeline, StaticMixture
from zephon_core.verify.curriculum_audit import audit_curriculum, chunks_read
from zephon_core.verify.simulate import Phase, first_mismatch, run_phase, run_schedule


def _maker(seed: int = 0):
    src = MemorySource([[1 + i % 7] * (3 + i % 5) for i in range(60)], name="m")

    def make(dp_degree: int, dp_group_id: int) -> Pipeline:
        return (Pipeline(StaticMixture([src], seed=seed, chunk_size=4)).pack(8).batch(1)
                .options(canonical_replicas=4, dp_degree=dp_degree, dp_group_id=dp_group_id, prefetch=0))
    return make


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
