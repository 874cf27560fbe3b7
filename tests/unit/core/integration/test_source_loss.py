"""Per-source loss ids and figures (zephon_core.integration.source_loss), against the tokens themselves.

Every token of the test corpus names its source (``core_fixtures.encode_token``), so the source of each
label can be read off the label without the segments the code under test reads.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.core_fixtures import _SRC_STRIDE, mixture, take, token_pipeline

from zephon_core.integration.source_loss import (
    SourceLoss,
    add_source_loss_hook,
    label_sources,
    publish_source_loss,
    source_loss_of,
)


def _expected(b) -> np.ndarray:
    return np.where(b.loss_mask, b.labels // _SRC_STRIDE, -1).astype(np.int32)


@pytest.mark.parametrize("mode", ["concat", "pad", "best_fit"])
def test_label_sources_name_each_labels_source_and_mark_padding(mode):
    p = token_pipeline(mixture((300, 200, 100), (0.5, 0.3, 0.2)), seq_len=24, batch_size=3, mode=mode,
                       shuffle_window=4)
    batches = take(p, 12)
    for b in batches:
        got = label_sources(b)
        assert got.shape == b.labels.shape and got.dtype == np.int32
        np.testing.assert_array_equal(got, _expected(b))
    ids = np.concatenate([label_sources(b).ravel() for b in batches])
    assert {0, 1, 2} <= set(np.unique(ids).tolist())
    assert (-1 in ids) == (mode == "pad")  # only "pad" leaves padding in these rows


def test_per_source_sums_add_up_to_the_ordinary_loss():
    b = take(token_pipeline(mixture((300, 200)), seq_len=32, batch_size=4, mode="pad"), 1)[0]
    src = label_sources(b)
    loss = np.random.default_rng(0).random(src.shape)
    counted = src >= 0
    sums = np.bincount(src[counted], weights=loss[counted], minlength=2)
    tokens = np.bincount(src[counted], minlength=2)
    figures = source_loss_of(7, ["src0", "src1"], [sums, tokens])
    assert figures.loss_tokens == tuple(int(x) for x in tokens) and sum(figures.loss_tokens) == counted.sum()
    mean = sum(figures.loss_sum) / sum(figures.loss_tokens)
    assert mean == pytest.approx(loss[b.loss_mask].mean())
    weighted = sum(figures.scalars()[f"zephon/loss/{n}"] * t for n, t in zip(figures.names, figures.loss_tokens))
    assert weighted / sum(figures.loss_tokens) == pytest.approx(mean)


def test_figures_scalars_line_and_interval_sum():
    a = SourceLoss(1, ("web", "code"), (6.0, 0.0), (3, 0))
    b = SourceLoss(2, ("web", "code"), (2.0, 4.0), (1, 2))
    # A source without tokens has no mean to log.
    assert a.scalars() == {"zephon/loss/web": 2.0, "zephon/loss_tokens/web": 3.0, "zephon/loss_tokens/code": 0.0}
    assert a.line() == "zephon: loss by source web=2.00000 code=-"
    assert a.plus(b) == SourceLoss(2, ("web", "code"), (8.0, 4.0), (4, 2))


def test_hooks_receive_each_published_step_until_removed():
    seen: list[SourceLoss] = []
    remove = add_source_loss_hook(seen.append)
    figures = SourceLoss(3, ("web",), (1.5,), (2,))
    publish_source_loss(figures)
    remove()
    publish_source_loss(figures)
    assert seen == [figures]
