"""Per-source training loss on TorchTitan 0.3 (``source_loss``): the real loader, TorchTitan's real
ChunkedLossWrapper and cross entropy around a real linear head, and the metrics processor's log.

The expected figures are recomputed here from each batch's provenance (its segments, walked row by
row in Python) and the per-token loss, not from the ids the code under test builds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

import torch.nn.functional as F  # noqa: E402
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss  # noqa: E402
from torchtitan.components.tokenizer import HuggingFaceTokenizer  # noqa: E402
from torchtitan_cpu.runs import mixed_recipe  # noqa: E402

import zephon_torchtitan as zt  # noqa: E402
import zephon_torchtitan.metrics as ztm  # noqa: E402
from zephon_core.integration import IntegrationError, SourceLoss, add_source_loss_hook  # noqa: E402
from zephon_torchtitan.core import IGNORE_INDEX  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SEQ, HIDDEN = 256, 8


@pytest.fixture(scope="module")
def tok():
    return HuggingFaceTokenizer(tokenizer_path=str(ROOT / "configs" / "corpus"))


def _loader(tok, tmp_path, **cfg):
    return zt.ZephonDataLoader.Config(recipe=str(mixed_recipe(tmp_path)), global_batch_size=8, **cfg).build(
        dp_world_size=2, dp_rank=0, tokenizer=tok, seq_len=SEQ, local_batch_size=2)


def _expected(batch_and_nll, n_sources):
    """Per source: loss sum and tokens, from the provenance walked in Python."""
    sums, counts = [0.0] * n_sources, [0] * n_sources
    for b, nll in batch_and_nll:
        for r, row in enumerate(b.provenance):
            filled = 0
            for seg in row:
                for t in range(filled, filled + seg.stop - seg.start):
                    if 1 <= t <= SEQ and b.loss_mask[r, t - 1]:  # label t - 1 is token t of the packed row
                        sums[seg.source] += float(nll[r, t - 1])
                        counts[seg.source] += 1
                filled += seg.stop - seg.start
    return sums, counts


def test_per_source_loss_matches_the_provenance_and_adds_up_to_the_loss(tok, tmp_path):
    loader = _loader(tok, tmp_path, source_loss=True)
    names = tuple(s.name for s in loader.pipeline.work_source.sources)
    loss_cfg = zt.zephon_source_loss(ChunkedLossWrapper.Config(num_chunks=4, loss_fn=CrossEntropyLoss.Config()))
    assert type(loss_cfg) is zt.ZephonChunkedLossWrapper.Config and loss_cfg.num_chunks == 4
    assert type(loss_cfg.loss_fn) is zt.ZephonCrossEntropyLoss.Config and loss_cfg.loss_fn.in_chunks
    loss_fn = loss_cfg.build()
    torch.manual_seed(0)
    head = torch.nn.Linear(HIDDEN, tok.get_vocab_size())
    loss_fn.set_lm_head(head)
    seen, total, tokens = [], 0.0, 0
    remove = add_source_loss_hook(seen.append)
    it = iter(loader)
    batches = []
    for i in range(3):  # one logged interval of three micro-batches
        inputs, labels = next(it)
        if i == 0:  # torch's pipeline schedules compute the first loss twice, first on outputs the step discards
            loss_fn(torch.randn(*labels.shape, HIDDEN, requires_grad=True) * 10, labels, torch.tensor(1))
        hidden = torch.randn(*labels.shape, HIDDEN, requires_grad=True)
        loss, _ = loss_fn(hidden, labels, torch.tensor(1))
        loss.backward()
        with torch.no_grad():
            nll = F.cross_entropy(head(hidden).flatten(0, 1), labels.flatten(), reduction="none",
                                  ignore_index=IGNORE_INDEX).reshape(labels.shape)
        total += float(loss.detach())
        tokens += int((labels != IGNORE_INDEX).sum())
        batches.append(nll)
    figures = ztm.TrainingMetrics().source_loss(3, None)
    assert ztm.TrainingMetrics().source_loss(4, None) == SourceLoss(4, names, (0.0,) * 3, (0,) * 3)
    remove()
    # The same batches from a fresh loader (a loader is deterministic) give the provenance.
    replay = iter(_loader(tok, tmp_path).pipeline)
    pairs = [(next(replay), nll) for nll in batches]
    assert seen[0] == figures and figures.names == names
    want_sums, want_counts = _expected(pairs, len(names))
    assert list(figures.loss_tokens) == want_counts and sum(want_counts) == tokens
    assert list(figures.loss_sum) == pytest.approx(want_sums, rel=1e-5)
    assert sum(figures.loss_sum) == pytest.approx(total, rel=1e-5), "the sums add up to the ordinary (summed) loss"
    assert sum(1 for n in want_counts if n) >= 2, "the batches should mix sources"
    scalars = figures.scalars()
    means = {k for k in scalars if k.startswith("zephon/loss/")}
    assert means == {f"zephon/loss/{n}" for n, c in zip(names, want_counts) if c}
    assert [scalars[f"zephon/loss_tokens/{n}"] for n in names] == want_counts


def test_validation_calls_and_a_loader_without_source_loss_add_nothing(tok, tmp_path):
    loader = _loader(tok, tmp_path)
    assert loader._stream.source_loss is None and ztm.TrainingMetrics().source_loss(1, None) is None
    on = _loader(tok, tmp_path, source_loss=True)
    _, labels = next(iter(on))
    loss_fn = zt.ZephonCrossEntropyLoss.Config().build()
    with torch.no_grad():
        loss_fn(torch.randn(*labels.shape, tok.get_vocab_size()), labels)
    with pytest.raises(IntegrationError, match="no token to a source; add zephon_torchtitan.zephon_source_loss"):
        ztm.TrainingMetrics().source_loss(1, None)


def test_a_loss_other_than_cross_entropy_is_refused():
    from torchtitan.components.loss import MSELoss

    with pytest.raises(IntegrationError, match="source_loss measures cross entropy, but this job's loss is"):
        zt.zephon_source_loss(MSELoss.Config())
