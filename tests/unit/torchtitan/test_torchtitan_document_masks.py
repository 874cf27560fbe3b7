"""Document masks in TorchTitan 0.3, proven on Zephon's rows: a token's loss does not depend on the other
documents of its row.

TorchTitan 0.3's language models always attend block-causally: the trainer
(``Trainer.post_dataloading_process``) passes every loader key but ``input``
to the model and builds the attention masks from ``positions`` with
``model.get_attention_masks`` (a new document wherever ``positions`` is 0).
These tests do exactly that with llama3's debug model (the flavour the CPU
e2e runs train) and the batches of the real ``ZephonDataLoader`` over a
pretokenized recipe packed ``best_fit`` (and ``concat``, where documents are
split across rows): one document of a row is altered in the corpus (same
length, so the rows keep their layout) and every other token's loss must stay
the same. The control feeds the same rows with positions that never restart —
one document per row, i.e. plain causal attention — and the untouched losses
then move, so the check can fail.

What runs on CPU (torch 2.14.1): the ``flex`` backend. FlexAttention has no
CPU backward, so the losses are computed under ``no_grad``. The mask is
TorchTitan's BlockMask (causal AND its packed-document mask_mod), built with
torch's eager ``create_block_mask`` (TorchTitan's ``torch.compile``-d one also
runs on CPU but costs ~40 s of cold compilation). The attention is torch's
eager ``flex_attention`` in most tests and TorchTitan's own compiled kernel
(``FlexAttention._compiled_flex_attn``, inductor's CPU flex template) in one.
The ``varlen`` backend cannot run on CPU (``aten::_flash_attention_forward``
has no CPU kernel) and ``sdpa`` is refused for language models by TorchTitan
0.3 itself.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

import torch.nn.functional as F  # noqa: E402
from support.document_masks import (  # noqa: E402
    altered,
    check_isolated,
    check_leaks,
    corpus,
    documents_per_row,
    owners,
    pick_document,
)
from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402
from torchtitan.models.common import attention as tt_attention  # noqa: E402
from torchtitan.models.llama3 import model_registry  # noqa: E402

import zephon_torchtitan as zt  # noqa: E402
from zephon_torchtitan.core import IGNORE_INDEX  # noqa: E402

SEQ, BATCH = 64, 2
DOCS = corpus()

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _recipe(tmp_path, docs, mode: str, name: str):
    np.save(tmp_path / f"{name}.tok.npy", np.concatenate(docs))
    np.save(tmp_path / f"{name}.off.npy", np.cumsum([0] + [len(d) for d in docs]))
    window = "pack_window = 16\n" if mode != "concat" else ""
    recipe = tmp_path / f"{name}.toml"
    recipe.write_text(f'seed = 7\nchunk_size = 8\ncanonical_replicas = 1\npack_mode = "{mode}"\n{window}'
                      f'[[sources]]\nformat = "token_array"\npath = "{name}.tok.npy"\noffsets = "{name}.off.npy"\n')
    return recipe


def _loader(recipe):
    return zt.ZephonDataLoader.Config(recipe=str(recipe), global_batch_size=BATCH).build(
        dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=SEQ, local_batch_size=BATCH)


def _first_batch(tmp_path, docs, mode: str, name: str):
    """The loader's first ``(input_dict, labels)`` and the Zephon batch it came from (its provenance)."""
    recipe = _recipe(tmp_path, docs, mode, name)
    x, y = next(iter(_loader(recipe)))
    b = next(iter(_loader(recipe).pipeline))
    assert torch.equal(x["input"], torch.from_numpy(b.input_ids)) and torch.equal(x["positions"], torch.from_numpy(b.positions))
    return x, y, owners(b)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = model_registry("debugmodel").model.build()  # flex attention: llama3's default backend
    m.init_states()
    return m.eval()


@pytest.fixture
def eager_mask(monkeypatch):
    monkeypatch.setattr(tt_attention, "_compiled_create_block_mask", create_block_mask)


@pytest.fixture
def eager_flex(eager_mask, monkeypatch):
    monkeypatch.setattr(tt_attention.FlexAttention, "_compiled_flex_attn", flex_attention)


def losses(model, x: dict, y: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy ``[B, L]`` the way TorchTitan's trainer feeds the model (post_dataloading_process)."""
    inputs = x["input"]
    extra = {k: v for k, v in x.items() if k != "input"}
    with torch.no_grad():
        extra["attention_masks"] = model.get_attention_masks(positions=extra["positions"])
        logits = model(inputs, **extra)
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE_INDEX, reduction="none").view(y.shape)


def _causal(x: dict) -> dict:
    """The same rows with positions 0..L-1: TorchTitan's block-causal mask then has one document per row."""
    return {**x, "positions": torch.arange(x["input"].shape[1]).expand_as(x["input"]).contiguous()}


@pytest.mark.parametrize("mode", ["best_fit", "concat"])
def test_a_tokens_loss_ignores_the_other_documents_of_its_row(model, eager_flex, tmp_path, mode):
    x, y, owner = _first_batch(tmp_path, DOCS, mode, "base")
    if mode == "best_fit":
        assert min(documents_per_row(owner)) >= 3, documents_per_row(owner)
        assert all(len(set(a[a >= 0]) & set(b[b >= 0])) == 0 for a, b in zip(owner, owner[1:]))  # documents kept whole
    doc = pick_document(owner)
    x2, y2, owner2 = _first_batch(tmp_path, altered(DOCS, doc), mode, "altered")
    np.testing.assert_array_equal(owner2, owner)  # same layout, same positions
    assert torch.equal(x2["positions"], x["positions"]) and not torch.equal(x2["input"], x["input"])
    check_isolated(losses(model, x, y), losses(model, x2, y2), owner, doc)
    check_leaks(losses(model, _causal(x), y), losses(model, _causal(x2), y2), owner, doc)


def test_concat_rows_split_a_document_whose_piece_in_the_next_row_restarts_at_position_0(tmp_path):
    """The concat case above alters a document cut across rows 0 and 1; Zephon restarts positions at a row's
    start, so its piece in row 1 is that row's first document for TorchTitan (RoPE counts it from 0)."""
    x, _, owner = _first_batch(tmp_path, DOCS, "concat", "base")
    doc = pick_document(owner)
    assert owner[1, 0] == doc and x["positions"][1, 0] == 0 and x["positions"][0, -1] > 0


def test_torchtitans_compiled_flex_kernel_runs_on_cpu_and_keeps_documents_apart(model, eager_mask, tmp_path):
    x, y, owner = _first_batch(tmp_path, DOCS, "best_fit", "base")
    doc = pick_document(owner)
    x2, y2, _ = _first_batch(tmp_path, altered(DOCS, doc), "best_fit", "altered")
    compiled = losses(model, x, y)
    check_isolated(compiled, losses(model, x2, y2), owner, doc)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tt_attention.FlexAttention, "_compiled_flex_attn", flex_attention)
        eager = losses(model, x, y)
    valid = y != IGNORE_INDEX
    torch.testing.assert_close(compiled[valid], eager[valid], rtol=1e-4, atol=1e-4)

