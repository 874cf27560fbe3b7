"""Zephon batches as Megatron micro-batches: loss masks, positions, attention masks, cu_seqlens."""

from __future__ import annotations

from argparse import Namespace

import numpy as np
import pytest

from zephon_core import Batch, Cursor, MemorySource, Pipeline, StaticMixture
from zephon_megatron.batches import KEYS, BatchFormat, document_starts, to_megatron

EOD = 9


def _batch(rows: list[list[int]], positions: list[list[int]], valid_labels: list[int]) -> Batch:
    """A hand-made batch: rows of L+1 packed tokens, per-token positions, number of valid labels per row."""
    t = np.asarray(rows, dtype=np.int64)
    p = np.asarray(positions, dtype=np.int64)
    L = t.shape[1] - 1
    lm = np.zeros((t.shape[0], L), dtype=bool)
    for r, n in enumerate(valid_labels):
        lm[r, :n] = True
    return Batch(t[:, :-1], t[:, 1:], p[:, :-1], lm, lane=0, lane_index=0, cursor=Cursor.start(), segments=np.zeros((0, 5), dtype=np.int64))


# Row 0: doc A (3 tokens incl. EOD) | doc B (4 tokens incl. EOD) | doc C starts; no padding.
# Row 1: doc C continues (positions restart at the row start) | EOD | then 3 padding tokens.
ROWS = [[5, 6, EOD, 1, 2, 3, EOD, 7, 8], [4, 4, EOD, 0, 0, 0, 0, 0, 0]]
POS = [[0, 1, 2, 0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 0, 0, 0, 0, 0]]
B = _batch(ROWS, POS, [8, 2])


def test_default_format_matches_megatrons_defaults():
    mb = to_megatron(B, BatchFormat(eod_id=EOD))
    assert set(mb) == set(KEYS)
    assert mb["tokens"].dtype == np.int64 and mb["labels"].dtype == np.int64 and mb["position_ids"].dtype == np.int64
    assert mb["loss_mask"].dtype == np.float32 and mb["tokens"].shape == (2, 8)
    assert (mb["position_ids"] == np.arange(8)).all()  # no reset: 0..L-1 on every row
    assert mb["loss_mask"].tolist() == [[1] * 8, [1, 1, 0, 0, 0, 0, 0, 0]]  # padding labels masked
    assert mb["attention_mask"] is None and mb["cu_seqlens"] is None


def test_eod_mask_loss_masks_where_the_input_is_eod():
    mb = to_megatron(B, BatchFormat(eod_id=EOD, eod_mask_loss=True))
    assert mb["loss_mask"].tolist() == [[1, 1, 0, 1, 1, 1, 0, 1], [1, 1, 0, 0, 0, 0, 0, 0]]


def test_reset_position_ids_restarts_per_document_and_continues_through_padding():
    mb = to_megatron(B, BatchFormat(eod_id=EOD, reset_position_ids=True))
    assert mb["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 5, 6, 7]]


def test_document_starts_fold_padding_into_the_last_document():
    assert [s.tolist() for s in document_starts(B)] == [[0, 3, 7], [0]]


def test_reset_attention_mask_blocks_the_future_and_earlier_documents():
    mb = to_megatron(B, BatchFormat(eod_id=EOD, attention_mask=True, reset_attention_mask=True))
    m = mb["attention_mask"]
    assert m.shape == (2, 1, 8, 8) and m.dtype == bool
    allowed = ~m[0, 0]
    # Query 4 (doc B) sees keys 3..4 only; query 7 (doc C) sees itself only.
    assert np.flatnonzero(allowed[4]).tolist() == [3, 4]
    assert np.flatnonzero(allowed[7]).tolist() == [7]
    # Row 1 is one document: plain causal.
    assert (~m[1, 0] == np.tril(np.ones((8, 8), dtype=bool))).all()


def test_causal_mask_without_reset_is_lower_triangular():
    m = to_megatron(B, BatchFormat(attention_mask=True))["attention_mask"]
    assert (~m[0, 0] == np.tril(np.ones((8, 8), dtype=bool))).all()


def test_cu_seqlens_in_megatrons_padded_layout():
    mb = to_megatron(B, BatchFormat(eod_id=EOD, cu_seqlens=True))
    cu = mb["cu_seqlens"]
    assert cu.dtype == np.int32 and cu.shape == (2, 9)
    assert cu[0].tolist() == [0, 3, 7, 8, 8, 8, 8, 8, 8]
    assert cu[1].tolist() == [0, 8, 8, 8, 8, 8, 8, 8, 8]
    assert mb["max_seqlen"].tolist() == [4, 8]


def test_format_from_megatron_flags():
    args = Namespace(eod_mask_loss=True, reset_position_ids=True, reset_attention_mask=True,
                     create_attention_mask_in_dataloader=True, dataloader_inter_document_masking=False)
    fmt = BatchFormat.from_args(args, EOD)
    assert fmt == BatchFormat(eod_id=EOD, eod_mask_loss=True, reset_position_ids=True, attention_mask=True,
                              reset_attention_mask=True, cu_seqlens=False)
    # Megatron's default create_attention_mask_in_dataloader=True alone asks for no mask: the model makes the causal one.
    assert not BatchFormat.from_args(Namespace(create_attention_mask_in_dataloader=True), EOD).attention_mask


@pytest.mark.parametrize("mode", ["concat", "pad"])
def test_real_pipeline_batches_convert_consistently(mode):
    docs = [[10 + d] * (2 + d % 7) + [EOD] for d in range(40)]
    p = (Pipeline(StaticMixture([MemorySource(docs)], seed=3, chunk_size=5)).pack(12, mode=mode).batch(3)
         .options(canonical_replicas=1))
    fmt = BatchFormat(eod_id=EOD, eod_mask_loss=True, reset_position_ids=True, cu_seqlens=True)
    for b, _ in zip(p, range(6)):
        mb = to_megatron(b, fmt)
        valid = b.loss_mask
        # Where labels are real, positions agree with Zephon's per-document positions.
        assert (mb["position_ids"][valid] == b.positions[valid]).all()
        # Loss only on real labels, never where the input is EOD.
        assert not mb["loss_mask"][~valid].any() and not mb["loss_mask"][b.input_ids == EOD].any()
        for r in range(len(b)):
            cu = mb["cu_seqlens"][r]
            bounds = cu[: np.argmax(cu == 12) + 1]
            assert bounds[0] == 0 and bounds[-1] == 12 and (np.diff(bounds) > 0).all()
            assert mb["max_seqlen"][r] == np.diff(bounds).max()
