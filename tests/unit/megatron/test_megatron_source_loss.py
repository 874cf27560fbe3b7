"""Megatron's per-source loss (``--zephon-source-loss``): the tally a training loss call adds to, its figures at a
logged iteration (one process: nothing to reduce), and the layouts it refuses. The launch is
tests/e2e/test_source_loss_e2e.py::test_megatron_logs_each_sources_loss_and_they_add_up_to_the_loss."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from zephon_core.integration import add_source_loss_hook  # noqa: E402
from zephon_megatron import loader  # noqa: E402
from zephon_megatron.pretrain_gpt import loss_func  # noqa: E402
from zephon_megatron.source_loss import MegatronSourceLoss  # noqa: E402
from zephon_megatron.validate import ZephonMegatronError  # noqa: E402


class _Writer:
    def __init__(self):
        self.scalars = {}

    def add_scalar(self, name, value, step):
        self.scalars[(name, step)] = value


def test_training_loss_calls_add_each_counted_label_to_its_source_and_a_logged_iteration_hands_them_on(monkeypatch):
    writer, heard = _Writer(), []
    tally = MegatronSourceLoss(("a", "b"), log_interval=2, writes=True, writers=lambda: (writer, None))
    monkeypatch.setattr(loader, "current_source_loss", lambda: tally)
    remove = add_source_loss_hook(heard.append)
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    sources = torch.tensor([[0, 1, 1], [1, -1, 0]])
    total, tokens, _ = loss_func(mask, per_token, sources=sources)
    assert float(total.detach()) == 1 + 2 + 4 + 5 + 6 and int(tokens) == 5  # Megatron's loss is unchanged
    with torch.no_grad():
        loss_func(mask, per_token, sources=sources)  # evaluation (no gradient) adds nothing
    assert tally.at_iteration(1) is None, "not a logged iteration"
    figures = tally.at_iteration(2)
    remove()
    # a: 1 (row 0) + 6 (row 1); b: 2 (row 0, its third label is masked) + 4 (row 1; the -1 label is padding).
    assert figures.loss_sum == (7.0, 6.0) and figures.loss_tokens == (2, 2) and heard == [figures]
    assert writer.scalars[("zephon/loss/a", 2)] == 3.5 and writer.scalars[("zephon/loss_tokens/b", 2)] == 2.0
    assert tally.at_iteration(4).loss_tokens == (0, 0), "each logged iteration takes the figures since the last"


def test_the_launch_route_and_context_parallelism_are_refused(monkeypatch):
    args = SimpleNamespace(log_interval=1, context_parallel_size=1)
    monkeypatch.setitem(loader.ROUTE, "megatron_broadcast", True)
    with pytest.raises(ZephonMegatronError, match=r"needs the wheel entry \(-m zephon_megatron.pretrain_gpt\)"):
        loader.per_source_loss(args, None)
    monkeypatch.setitem(loader.ROUTE, "megatron_broadcast", False)
    with pytest.raises(ZephonMegatronError, match="does not support context parallelism"):
        loader.per_source_loss(SimpleNamespace(log_interval=1, context_parallel_size=2), None)
