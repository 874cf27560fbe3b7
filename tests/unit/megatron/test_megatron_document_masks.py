"""Document masks in Megatron, proven on Zephon's rows: a token's loss does not depend on the other documents
of its row, through the packed-sequence (THD, ``cu_seqlens``) path and the dense ``--reset-attention-mask`` one.

Zephon side (real): best-fit rows (and concat rows, where a document is split
across rows) of a Pipeline, turned into micro-batches by the adapter's own
``micro_batch`` with the ``BatchFormat`` Megatron's flags give
(``--dataloader-inter-document-masking``: ``cu_seqlens``/``max_seqlen``;
``--reset-attention-mask --reset-position-ids``: a per-document mask).

Megatron side, in one spawned gloo process under the CPU shim
(zephon_megatron/cpu/shim.py: CUDA placements become CPU ones):
megatron-core's ``GPTModel`` with its local layer spec (RoPE, 2 layers),
``flatten_batch_for_packed_sequences`` merging the rows' ``cu_seqlens`` as
Megatron-LM's ``pretrain_gpt.py`` does, ``PackedSeqParams(qkv_format="thd")``
and Megatron's THD code in the attention layer (``[t, 1, ...]`` squeezed to
THD, RoPE applied per sequence from ``cu_seqlens``). megatron-core's local
``DotProductAttention`` refuses packed sequences (checked here, in case a
release lifts it) and TransformerEngine needs CUDA, so for THD the core
attention is the CPU-only ``zephon_megatron.cpu.thd_attention.ThdDotProductAttention``: it turns
``cu_seqlens`` into a block-diagonal causal mask and runs Megatron's own
``DotProductAttention.forward`` with it. The dense-mask path and the control
(plain causal: no ``cu_seqlens``, no mask; the untouched losses then move)
run Megatron's attention unchanged; the THD losses match the dense-mask ones.
"""

from __future__ import annotations

import importlib.util
from argparse import Namespace

import gloo_workers
import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
    pytest.skip("megatron-core is not installed", allow_module_level=True)

from support.document_masks import (  # noqa: E402
    VOCAB,
    altered,
    check_isolated,
    check_leaks,
    corpus,
    documents_per_row,
    owners,
    pick_document,
)

from zephon_core import MemorySource, Pipeline, StaticMixture  # noqa: E402

SEQ, MBS = 64, 2
DOCS = corpus()
MODES = ("best_fit", "concat")
#: Megatron's flags -> the adapter's batch format (zephon_megatron.batches.BatchFormat.from_args).
FLAGS = {
    "thd": Namespace(dataloader_inter_document_masking=True),
    "mask": Namespace(reset_attention_mask=True, reset_position_ids=True),
    "causal": Namespace(),
}


def _first_batch(docs, mode: str):
    pack = {"window": 16} if mode != "concat" else {}
    p = (Pipeline(StaticMixture([MemorySource(docs, name="docs")], seed=7, chunk_size=8)).pack(SEQ, mode=mode, **pack).batch(MBS)
         .options(dp_degree=1, dp_group_id=0, canonical_replicas=1))
    with p:
        return next(iter(p))


def _micro_batches(mode: str) -> dict:
    """Per flag set, the adapter's micro-batch of the first batch, for the corpus and for it with one document altered."""
    from zephon_megatron.batches import BatchFormat
    from zephon_megatron.iterators import micro_batch

    base = _first_batch(DOCS, mode)
    owner = owners(base)
    doc = pick_document(owner)
    other = _first_batch(altered(DOCS, doc), mode)
    np.testing.assert_array_equal(owners(other), owner)  # same lengths, same layout
    out: dict = {"owner": owner, "doc": doc}
    for name, flags in FLAGS.items():
        fmt = BatchFormat.from_args(flags, eod_id=None)
        out[name] = [dict(dict.items(micro_batch(b, fmt, audit=False))) for b in (base, other)]
    return out


def _model(core_attention=None):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
                               hidden_dropout=0.0, attention_dropout=0.0)
    spec = get_gpt_layer_local_spec()
    if core_attention is not None:
        spec.submodules.self_attention.submodules.core_attention = core_attention
    torch.manual_seed(0)
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                    position_embedding_type="rope").eval()


def _losses(model, mb: dict, packed: bool) -> torch.Tensor:
    """Per-token losses ``[B, L]``; ``packed``: as Megatron-LM's pretrain_gpt.py passes cu_seqlens (THD)."""
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.utils import flatten_batch_for_packed_sequences

    B, L = mb["tokens"].shape
    params = None
    if packed:
        mb = flatten_batch_for_packed_sequences(dict(mb))
        cu, longest = mb["cu_seqlens"].squeeze(0), int(mb["max_seqlen"].max())
        params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest, max_seqlen_kv=longest)
    with torch.no_grad():
        loss = model(mb["tokens"], mb["position_ids"], mb.get("attention_mask"), labels=mb["labels"], packed_seq_params=params)
    return loss.reshape(B, L).float()


def _worker(rank: int, out: str) -> None:
    from zephon_megatron.cpu import shim

    shim.apply()
    from megatron.core import parallel_state, tensor_parallel

    parallel_state.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    from zephon_megatron.cpu import thd_attention

    real = _model()
    thd = _model(thd_attention.ThdDotProductAttention)
    thd.load_state_dict(real.state_dict())
    result: dict = {"core_attention": type(real.decoder.layers[0].self_attention.core_attention).__module__}
    for mode in MODES:
        mbs = _micro_batches(mode)
        result[mode] = {"owner": mbs["owner"], "doc": mbs["doc"], "cu_seqlens": mbs["thd"][0]["cu_seqlens"].numpy(),
                        "thd": [_losses(thd, mb, packed=True) for mb in mbs["thd"]],
                        "mask": [_losses(real, mb, packed=False) for mb in mbs["mask"]],
                        "causal": [_losses(real, mb, packed=False) for mb in mbs["causal"]]}
    try:
        _losses(real, mbs["thd"][0], packed=True)
        result["refusal"] = None
    except AssertionError as e:
        result["refusal"] = str(e)
    torch.save(result, f"{out}.{rank}")
    parallel_state.destroy_model_parallel()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = gloo_workers.run(_worker, 1, tmp_path_factory.mktemp("docmask"))
    return torch.load(f"{out}.0", weights_only=False)


def test_megatrons_local_attention_refuses_packed_sequences(runs):
    assert runs["core_attention"] == "megatron.core.transformer.dot_product_attention"
    assert runs["refusal"] and "Packed sequence is not supported by DotProductAttention" in runs["refusal"]


def test_best_fit_rows_hold_several_whole_documents(runs):
    owner = runs["best_fit"]["owner"]
    assert min(documents_per_row(owner)) >= 3, documents_per_row(owner)
    assert not set(owner[0][owner[0] >= 0]) & set(owner[1][owner[1] >= 0])


def test_cu_seqlens_are_the_document_boundaries(runs):
    for mode in MODES:
        owner, cu = runs[mode]["owner"], runs[mode]["cu_seqlens"]
        for r in range(MBS):
            inputs = owner[r, :-1]
            starts = [0] + [i for i in range(1, SEQ) if inputs[i] != inputs[i - 1] and inputs[i] >= 0]
            assert cu[r].tolist() == starts + [SEQ] * (SEQ + 1 - len(starts)), (mode, r)  # padding joins the last document


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("path", ["thd", "mask"])
def test_a_tokens_loss_ignores_the_other_documents_of_its_row(runs, mode, path):
    r = runs[mode]
    check_isolated(*r[path], r["owner"], r["doc"])


@pytest.mark.parametrize("mode", MODES)
def test_without_document_masks_the_other_documents_leak_in(runs, mode):
    r = runs[mode]
    check_leaks(*r["causal"], r["owner"], r["doc"])


@pytest.mark.parametrize("mode", MODES)
def test_thd_and_the_dense_document_mask_give_the_same_losses(runs, mode):
    r = runs[mode]
    valid = torch.from_numpy(r["owner"][:, 1:] >= 0)
    for thd, mask in zip(r["thd"], r["mask"]):
        torch.testing.assert_close(thd[valid], mask[valid], rtol=1e-4, atol=1e-4)
