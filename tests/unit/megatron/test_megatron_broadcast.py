"""The adapter's tensor-parallel broadcast on gloo (2 processes), and its batches with Megatron's own broadcast."""

from __future__ import annotations

import gloo_workers
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from zephon_core import MemorySource, Pipeline, StaticMixture  # noqa: E402
from zephon_megatron.batches import BatchFormat  # noqa: E402

FORMATS = {
    "plain": BatchFormat(eod_id=9),
    "masks": BatchFormat(eod_id=9, eod_mask_loss=True, reset_position_ids=True, attention_mask=True, reset_attention_mask=True),
    "cu": BatchFormat(eod_id=9, reset_position_ids=True, cu_seqlens=True),
    # --zephon-source-loss: the label source ids ride after cu_seqlens in the payload.
    "sources": BatchFormat(eod_id=9, reset_position_ids=True, cu_seqlens=True, source_ids=True),
}


def _batches(fmt_name: str, n: int = 3):
    from zephon_megatron.iterators import micro_batch

    docs = [[10 + d] * (1 + d % 6) + [9] for d in range(30)]
    p = Pipeline(StaticMixture([MemorySource(docs)], seed=2, chunk_size=4)).pack(10).batch(2).options(canonical_replicas=1)
    return [micro_batch(b, FORMATS[fmt_name], run=RUN) for b, _ in zip(p, range(n))]

RUN = "f55e6e8d38500546"  # a run fingerprint, as TrainStream names it


def _worker(rank: int, out: str) -> None:
    import torch.distributed as dist

    from zephon_core.integration import log_line
    from zephon_megatron.broadcast import broadcast_microbatch

    results = {}
    for fmt_name, verify in CASES:
        rows = []
        for mb in _batches(fmt_name):
            got = broadcast_microbatch(mb if rank == 0 else None, src=0, group=dist.group.WORLD, verify=verify)
            rows.append({k: (v.numpy() if v is not None else None) for k, v in dict.items(got)})
            rows[-1]["meta"] = None if got.meta is None else (log_line(got.meta), got.meta.run)
        results[fmt_name] = rows
    torch.save(results, f"{out}.{rank}")
    solo = dist.new_group([0])
    if rank == 0:
        with open(f"{out}.megatron", "w") as f:
            f.write(_megatron_check(solo))


def _megatron_check(group) -> str:
    """A micro-batch through Megatron's own get_batch_on_this_tp_rank, as a checkout's get_batch passes it."""
    try:
        from megatron.core.utils import get_batch_on_this_tp_rank
    except ImportError:
        return "absent"
    mb = _batches("plain", 1)[0]
    assert "attention_mask" not in mb and mb["attention_mask"] is None
    # Tensor-parallel rank 0 with Megatron's default mask flag on and TP=1: no mask is sent or expected.
    batch = get_batch_on_this_tp_rank(
        dict(mb), has_cu_seqlens=False, is_hybrid_cp=False, create_attention_mask_in_dataloader=True,
        broadcast_src_rank=0, broadcast_group=group, cp_size=1, tp_rank=0, micro_batch_size=2,
        seq_length=10, mtp_on_this_rank=False,
    )
    assert batch["attention_mask"] is None and tuple(batch["tokens"].shape) == (2, 10)
    return "ok"


CASES = [("plain", True), ("masks", False), ("cu", True), ("sources", True)]


@pytest.fixture(scope="module")
def exchanged(tmp_path_factory):
    """Run the 2-process exchange once: what rank 0 sent and rank 1 received, per format."""
    out = gloo_workers.run(_worker, 2, tmp_path_factory.mktemp("bcast"))
    with open(f"{out}.megatron") as f:
        megatron = f.read()
    return torch.load(f"{out}.0", weights_only=False), torch.load(f"{out}.1", weights_only=False), megatron


@pytest.mark.parametrize("fmt_name", [c[0] for c in CASES])
def test_peers_receive_exactly_what_rank_zero_sent(exchanged, fmt_name):
    sent, got = exchanged[0][fmt_name], exchanged[1][fmt_name]
    assert len(sent) == len(got) == 3
    for a, b in zip(sent, got):
        assert set(k for k, v in a.items() if v is not None) == set(k for k, v in b.items() if v is not None)
        for k, v in a.items():
            if isinstance(v, np.ndarray):
                assert v.dtype == b[k].dtype and v.shape == b[k].shape and (v == b[k]).all(), k
        assert a["meta"] == b["meta"] and len(a["meta"][0].split()) == 3 and a["meta"][1] == RUN  # the run travels
        assert b["tokens"].dtype == np.int64 and b["loss_mask"].dtype == np.float32
        if fmt_name == "masks":
            assert b["attention_mask"].dtype == bool and b["attention_mask"].shape == (2, 1, 10, 10)
        if fmt_name in ("cu", "sources"):
            assert b["cu_seqlens"].dtype == np.int32 and b["max_seqlen"].dtype == np.int32
        assert ("zephon_sources" in b) == (fmt_name == "sources")
        if fmt_name == "sources":
            assert b["zephon_sources"].shape == (2, 10) and set(np.unique(b["zephon_sources"])) <= {-1, 0}


def test_batches_fit_megatrons_get_batch_on_this_tp_rank(exchanged):
    if exchanged[2] == "absent":
        pytest.skip("megatron-core is not installed")
    assert exchanged[2] == "ok"
