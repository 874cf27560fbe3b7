"""Per-source training loss: which source each label token came from, and the figures a step hands on.

An adapter that turns it on keeps, for every batch it delivers, ``label_sources(batch)``: one source
number per label token, ``-1`` where the label is padding (outside the loss mask). The training step
adds each counted token's loss to its source (``loss_sum``) and counts it (``loss_tokens``), reduces
the pair over the data-parallel group, and hands one ``SourceLoss`` per step to ``publish_source_loss``:
the adapter logs ``zephon/loss/<source>`` from it, and every hook added with ``add_source_loss_hook``
receives it (a mixing controller's input: the same figures on every rank).

Nothing here touches the data: the ids are read from a batch's ``segments`` after it was cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from zephon_core.batch import Batch


def label_sources(batch: Batch) -> np.ndarray:
    """``[B, L]`` int32: the source number of each label token, ``-1`` where the label is padding.

    Label ``t`` of a row is token ``t + 1`` of the packed row (``L + 1`` tokens), so a label that
    crosses into the next document counts for that document's source. Built from the segments
    with NumPy (``np.repeat`` over segment lengths): no Python work per token.
    """
    n_rows, L = batch.input_ids.shape
    width = L + 1
    seg = batch.segments
    out = np.full((n_rows, width), -1, dtype=np.int32)
    if len(seg):
        seg = seg[seg[:, 4] > seg[:, 3]]
        lengths = seg[:, 4] - seg[:, 3]
        filled = np.zeros(len(seg) + 1, dtype=np.int64)
        np.cumsum(lengths, out=filled[1:])
        row_start = filled[np.searchsorted(seg[:, 0], seg[:, 0], side="left")]
        begin = seg[:, 0] * width + filled[:-1] - row_start  # flat index of each segment's first token
        flat = np.repeat(begin - filled[:-1], lengths) + np.arange(filled[-1])
        out.reshape(-1)[flat] = np.repeat(seg[:, 1].astype(np.int32), lengths)
    return out[:, 1:]


@dataclass(frozen=True)
class SourceLoss:
    """One training step's per-source loss, reduced over the data-parallel group (equal on every rank).

    ``names`` in the curriculum's source order; ``loss_sum[i]``: the loss summed over the counted
    label tokens of source ``i``; ``loss_tokens[i]``: those tokens. The pair is what a mixing
    controller's ``record_loss(loss_sum, loss_tokens)`` takes.
    """

    step: int
    names: tuple[str, ...]
    loss_sum: tuple[float, ...]
    loss_tokens: tuple[int, ...]

    def scalars(self, prefix: str = "zephon/") -> dict[str, float]:
        """``<prefix>loss/<source>``: the mean loss per token of each source with tokens in the step, and
        ``<prefix>loss_tokens/<source>``: the tokens it was taken over (every source)."""
        out = {f"{prefix}loss/{name}": s / n for name, s, n in zip(self.names, self.loss_sum, self.loss_tokens) if n}
        out.update({f"{prefix}loss_tokens/{name}": float(n) for name, n in zip(self.names, self.loss_tokens)})
        return out

    def line(self) -> str:
        """The console form: ``zephon: loss by source <name>=<mean> ...`` (``-`` for a source without tokens)."""
        parts = [f"{name}={s / n:.5f}" if n else f"{name}=-"
                 for name, s, n in zip(self.names, self.loss_sum, self.loss_tokens)]
        return "zephon: loss by source " + " ".join(parts)

    def plus(self, other: SourceLoss) -> SourceLoss:
        """Both steps' figures added up (a logging interval's), stamped with ``other``'s step."""
        return SourceLoss(other.step, self.names, tuple(a + b for a, b in zip(self.loss_sum, other.loss_sum)),
                          tuple(a + b for a, b in zip(self.loss_tokens, other.loss_tokens)))


def source_loss_of(step: int, names: Sequence[str], reduced: Sequence[Sequence[float]]) -> SourceLoss:
    """The ``SourceLoss`` of a reduced ``[2, n_sources]`` table: row 0 the loss sums, row 1 the token counts."""
    sums, counts = reduced
    return SourceLoss(step, tuple(names), tuple(float(x) for x in sums), tuple(int(round(float(x))) for x in counts))


#: What receives each step's figures: a mixing controller's feed, a test's recorder.
SourceLossHook = Callable[[SourceLoss], None]
_HOOKS: list[SourceLossHook] = []


def add_source_loss_hook(hook: SourceLossHook) -> Callable[[], None]:
    """Call ``hook`` with every step's ``SourceLoss`` in this process; returns the function that removes it.

    Hooks run on every rank, after the reduction, in the order they were added; on a training
    step's path, so they should be cheap (add the figures up, decide at an interval).
    """
    _HOOKS.append(hook)
    return lambda: _HOOKS.remove(hook) if hook in _HOOKS else None


def publish_source_loss(figures: SourceLoss) -> None:
    """Hand one step's figures to every hook (the adapters call this once per training step)."""
    for hook in tuple(_HOOKS):
        hook(figures)
