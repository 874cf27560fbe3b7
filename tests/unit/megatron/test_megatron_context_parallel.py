"""Context parallelism at loader level: two gloo processes as the two context-parallel ranks of one
data-parallel rank, with megatron-core's own process groups and its own sequence split.

Each rank reads its own Pipeline (the same data identity), so both hold the same full micro-batches;
each keeps its slice with Megatron's ``get_batch_on_this_cp_rank`` — as the wheel entry's
``get_batch`` does, and for packed sequences (``cu_seqlens``, THD) as megatron-core 0.19's
``pretrain_gpt.py`` does (flattened, then split per sequence). Put back together in Megatron's
zigzag order, the slices are the whole micro-batch.
"""

from __future__ import annotations

from argparse import Namespace

import gloo_workers
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core.parallel_state")

from zephon_core import MemorySource, Pipeline, StaticMixture  # noqa: E402

CP, SEQ, MBS = 2, 16, 2
DOCS = [[20 + d % 40] * (2 + d % 7) + [9] for d in range(200)]


def _micro_batches(cu_seqlens: bool, n: int = 3):
    from zephon_megatron.batches import BatchFormat
    from zephon_megatron.iterators import micro_batch

    p = (Pipeline(StaticMixture([MemorySource(DOCS, name="m")], seed=3, chunk_size=4)).pack(SEQ).batch(MBS)
         .options(dp_degree=1, dp_group_id=0, canonical_replicas=2))
    fmt = BatchFormat(eod_id=9, reset_position_ids=cu_seqlens, cu_seqlens=cu_seqlens)
    try:
        return [micro_batch(b, fmt) for b, _ in zip(p, range(n))]
    finally:
        p.close()


def _worker(rank: int, out: str) -> None:
    from megatron.core import parallel_state
    from megatron.core.utils import flatten_batch_for_packed_sequences, get_batch_on_this_cp_rank

    from zephon_megatron.loader import Place
    from zephon_megatron.pretrain_gpt import this_cp_rank_slice

    parallel_state.initialize_model_parallel(context_parallel_size=CP)
    place = Place.from_mpu(Namespace(dataloader_inter_document_masking=False))
    result = {"place": (place.dp, place.cp_rank, place.loads, place.saves)}
    result["plain"] = [{k: v.numpy() for k, v in this_cp_rank_slice(dict(mb)).items() if v is not None}
                       for mb in _micro_batches(False)]
    packed = []
    for mb in _micro_batches(True):
        flat = flatten_batch_for_packed_sequences(dict(mb))
        cut = get_batch_on_this_cp_rank(dict(flat), is_hybrid_cp=False, cp_group=parallel_state.get_context_parallel_group(),
                                        use_per_sequence_balancing=True)
        packed.append({k: v.numpy() for k, v in cut.items() if isinstance(v, torch.Tensor)})
    result["packed"] = packed
    torch.save(result, f"{out}.{rank}")
    parallel_state.destroy_model_parallel()


@pytest.fixture(scope="module")
def slices(tmp_path_factory):
    out = gloo_workers.run(_worker, CP, tmp_path_factory.mktemp("cp"))
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(CP)]


def _zigzag(parts: list[np.ndarray], axis: int) -> np.ndarray:
    """Megatron's per-sequence split undone: rank r holds chunks r and 2*CP-1-r of 2*CP."""
    chunks: list[np.ndarray | None] = [None] * (2 * CP)
    for r, part in enumerate(parts):
        first, second = np.split(part, 2, axis=axis)
        chunks[r], chunks[2 * CP - 1 - r] = first, second
    return np.concatenate(chunks, axis=axis)


def test_context_parallel_ranks_are_one_data_parallel_rank_and_only_rank_zero_saves(slices):
    assert [s["place"] for s in slices] == [(1, 0, True, True), (1, 1, True, False)]


def test_each_rank_keeps_its_slice_of_the_full_batch_megatrons_way(slices):
    for n, full in enumerate(_micro_batches(False)):
        for key in ("tokens", "labels", "loss_mask", "position_ids"):
            parts = [s["plain"][n][key] for s in slices]
            assert all(p.shape == (MBS, SEQ // CP) for p in parts)
            assert (_zigzag(parts, axis=1) == full[key].numpy()).all(), key


def test_packed_sequences_are_flattened_then_split_per_sequence(slices):
    for n, full in enumerate(_micro_batches(True)):
        for key in ("tokens", "labels", "position_ids"):
            parts = [s["packed"][n][key] for s in slices]
            assert all(p.shape == (1, MBS * SEQ // CP) for p in parts)
            assert (_zigzag(parts, axis=1) == full[key].numpy().reshape(1, -1)).all(), key
        cu = [s["packed"][n]["cu_seqlens"] for s in slices]
        assert (cu[0] == cu[1]).all() and cu[0][0, -1] == MBS * SEQ  # one packed sequence, boundaries kept whole
