"""What ``zephon report --plot`` draws for a steered run: each source's decided weight against its realized share,
and the loss each decision was made on (docs/mixing.md), as plain arrays.

The weights are the journal's (``curriculum.journal``): a step function over global steps, each decision's
weights from the step it was made after (decision at step ``s``: from ``x = s``, the edge between steps ``s``
and ``s + 1``; step ``k`` spans ``k - 1 .. k`` as in ``figures.run_picture``). The realized shares come from
the audit logs (the share of each step's tokens, or documents under ``weight_by = documents``) or, when only
checkpoints are read, from the latest one's per-stage tallies (each stage's share, drawn over the steps its
weights were decided for). The losses are each decision's journaled ``figures``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zephon_core.curriculum.journal import DENOMINATOR, MixingJournal
from zephon_core.report.figures import shares_of
from zephon_core.report.history import Run


@dataclass(frozen=True)
class MixingPicture:
    """Per source ``s``: ``weights[s][j]`` in force over ``spans[j]`` (``(x0, x1, stage name)``);
    ``realized[s][k]`` its share of ``share_of`` over ``realized_edges[k] .. realized_edges[k + 1]`` (NaN: nothing
    delivered there); ``losses[s][n]`` the mean loss per token decision ``n`` (at ``decided_at[n]``) saw (NaN:
    none). ``realized_from`` says where the realized shares come from."""

    title: str
    sources: list[str]
    share_of: str
    spans: list[tuple[float, float, str]]
    weights: np.ndarray
    realized_edges: np.ndarray
    realized: np.ndarray
    realized_from: str
    decided_at: np.ndarray
    losses: np.ndarray
    notes: list[str] = field(default_factory=list)


def _first_decided_stage(run: Run, journal: MixingJournal) -> int:
    """The index of stage ``mix0`` in the run's curriculum (the journal's stages are its last ones)."""
    first = len(run.curriculum.stages) - len(journal.decisions)
    if first < 1 or run.curriculum.stages[first] != MixingJournal.stage_name(0):
        raise ValueError(f"the run's stages {run.curriculum.stages} do not end with the journal's "
                         f"{len(journal.decisions)} decision(s)")
    return first


def _spans(run: Run, journal: MixingJournal, first: int, x0: float, x1: float) -> list[tuple[int, float, float]]:
    """``(stage, from, to)`` over global steps: each decided stage from its decision on, and the recipe's stages
    before it where the input tells when they began (audit logs: the step the first lane entered; a checkpoint:
    only a recipe of one stage, which began with the run)."""
    starts: list[tuple[int, float]] = []
    for i in range(first):
        entered = run.entered[i] if run.entered and i < len(run.entered) else None
        if i == 0:
            starts.append((0, x0))
        elif entered is not None:
            starts.append((i, float(entered[0] - 1)))
    if not run.history.every_step:  # a checkpoint does not record when a recipe's later stage began
        starts = starts if first == 1 else []
    starts += [(first + n, float(d.step)) for n, d in enumerate(journal.decisions)]
    ends = [x for _, x in starts[1:]] + [x1]
    return [(i, a, b) for (i, a), b in zip(starts, ends) if b > a]


def _weights(run: Run, journal: MixingJournal, first: int, stage: int) -> list[float]:
    """Stage ``stage``'s shares per source: a decision's from the journal, a recipe stage's as planned."""
    names = run.curriculum.sources
    if stage >= first:
        w = journal.decisions[stage - first].weights
        return [w.get(n, 0) / DENOMINATOR for n in names]
    shares = run.curriculum.shares
    return list(shares[stage][1]) if shares and stage < len(shares) else [np.nan] * len(names)


def bin_width(journal: MixingJournal, steps: int) -> int:
    """Steps per realized share from audit logs: the shortest gap between decisions (a step alone holds a few
    documents, too few to read a share from), or a twentieth of the run with one decision."""
    at = [d.step for d in journal.decisions]
    gaps = [b - a for a, b in zip(at, at[1:]) if b > a]
    return max(1, min(gaps) if gaps else steps // 20)


def mixing_picture(run: Run, journal: MixingJournal, title: str) -> MixingPicture:
    """The steered run ``run`` (its ``journal``): weights, realized shares and the losses decided on."""
    c, h = run.curriculum, run.history
    first = _first_decided_stage(run, journal)
    unit = h.tokens if journal.weight_by == "tokens" else h.documents  # [k, stage, source], cumulative
    x0 = float(h.steps[0] - 1) if h.every_step else 0.0
    spans = _spans(run, journal, first, x0, float(h.steps[-1]))
    weights = np.array([_weights(run, journal, first, i) for i, _, _ in spans], dtype=np.float64).T
    notes = []
    if h.every_step:
        width = bin_width(journal, len(h.steps))
        edges = np.unique(np.append(np.arange(x0, float(h.steps[-1]), width), float(h.steps[-1])))
        cumulative = unit.sum(axis=1)  # [k, source]: up to and including step steps[k]
        at = np.concatenate([np.zeros((1, cumulative.shape[1]), dtype=np.int64), cumulative])
        binned = np.diff(at[(edges - x0).astype(np.int64)], axis=0)  # [bin, source]
        realized = np.where(binned.sum(axis=1, keepdims=True) > 0, shares_of(binned, axis=1), np.nan).T
        realized_from = f"realized: share of the {journal.weight_by} of every {width} steps (audit logs)"
    else:
        stages = unit[-1][[i for i, _, _ in spans]]  # [span, source]: the latest checkpoint's per-stage tallies
        edges = np.array([a for _, a, _ in spans] + [spans[-1][2]], dtype=np.float64)
        realized = np.where(stages.sum(axis=1, keepdims=True) > 0, shares_of(stages, axis=1), np.nan).T
        realized_from = f"realized: each stage's share of the {journal.weight_by} its lanes delivered (tallies)"
        notes.append("a checkpoint: each stage's realized share is drawn over the steps its weights were decided "
                     "for; lanes enter a stage with a lag (docs/mixing.md), the audit logs show it step by step")
        if first > 1:
            notes.append(f"the recipe's stages ({', '.join(c.stages[:first])}) are not drawn: a checkpoint does not "
                         "record the steps they began at")
    for i, _, _ in spans:
        if i < first and c.shares and c.shares[i][0] != journal.weight_by:
            notes.append(f"the recipe's stage {c.stages[i]} weighs sources by {c.shares[i][0]}: the weights drawn "
                         f"there are shares of {c.shares[i][0]}, not of {journal.weight_by}")
    losses = np.array([[np.nan if (v := d.mean_loss(n)) is None else v for d in journal.decisions]
                       for n in c.sources], dtype=np.float64)
    if not any(d.figures for d in journal.decisions):
        notes.append("the journal records no losses (written before decisions kept their figures)")
    return MixingPicture(title, list(c.sources), journal.weight_by,
                         [(a, b, c.stages[i]) for i, a, b in spans], weights, edges, realized, realized_from,
                         np.array([d.step for d in journal.decisions], dtype=np.float64), losses, notes)
