"""The numbers ``zephon report`` prints and draws, as plain data: per stage and source, and over steps.

Everything here is a function of a ``run_history.Run`` (or, for the plan, of a work
source: ``plan_figures``) and returns arrays; ``plots`` only draws them. So what a
picture shows is what these functions return, and tests hold them to the run.

Shares compare like with like: a stage weighted by documents is held against the
document shares the run delivered in it, a stage weighted by tokens against its token
shares.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zephon_core.report.history import Run


def shares_of(counts: np.ndarray, axis: int = -1) -> np.ndarray:
    """``counts`` divided by their sum along ``axis`` (0 where the sum is 0)."""
    total = counts.sum(axis=axis, keepdims=True)
    return np.divide(counts, total, out=np.zeros(counts.shape, dtype=np.float64), where=total > 0)


@dataclass(frozen=True)
class StageFigures:
    """One stage of the run (or the whole run: ``index`` None), per source.

    ``planned`` is the stage's planned share of ``weight_by`` (None: not known);
    ``epochs`` are documents / the source's size (NaN where the size is unknown);
    ``first_step``/``last_step`` the steps that delivered in it (audit logs only: checkpoints do not tell).
    """

    index: int | None
    name: str
    weight_by: str | None
    tokens: np.ndarray
    documents: np.ndarray
    planned: np.ndarray | None
    epochs: np.ndarray
    first_step: int | None = None
    last_step: int | None = None

    def delivered_shares(self) -> np.ndarray | None:
        """The run's shares in the unit the stage's weights share (None when that unit is not known)."""
        if self.weight_by is None:
            return None
        return shares_of(self.tokens if self.weight_by == "tokens" else self.documents)


def _epochs(documents: np.ndarray, sizes: list[int | None]) -> np.ndarray:
    return np.array([d / n if n else np.nan for d, n in zip(documents.tolist(), sizes)], dtype=np.float64)


def _steps_in(run: Run, stage: int) -> tuple[int | None, int | None]:
    """The first and last step that delivered tokens in ``stage`` (None unless the history has every step)."""
    h = run.history
    if not h.every_step:
        return None, None
    per_step = np.diff(h.tokens[:, stage, :].sum(axis=1), prepend=0)
    hit = np.flatnonzero(per_step)
    if not len(hit):
        return None, None
    return int(h.steps[hit[0]]), int(h.steps[hit[-1]])


def stage_figures(run: Run) -> list[StageFigures]:
    """Per stage and in total (the last entry): what the run delivered, against what it was asked for."""
    c, h = run.curriculum, run.history
    tokens, documents = h.tokens[-1], h.documents[-1]
    out = []
    for i, name in enumerate(c.stages):
        weight_by, planned = (
            (c.shares[i][0], np.asarray(c.shares[i][1])) if c.shares and i < len(c.shares) else (None, None)
        )
        first, last = _steps_in(run, i)
        out.append(
            StageFigures(
                i, name, weight_by, tokens[i], documents[i], planned, _epochs(documents[i], c.sizes), first, last
            )
        )
    total = documents.sum(axis=0)
    out.append(
        StageFigures(
            None,
            "total",
            None,
            tokens.sum(axis=0),
            total,
            None,
            _epochs(total, c.sizes),
            int(h.steps[0]) if h.every_step else None,
            int(h.steps[-1]) if h.every_step else None,
        )
    )
    return out


def fractions(run: Run) -> tuple[float | None, float | None]:
    """Padding (pad tokens / row tokens) and truncation (stretches continuing a cut document / all stretches).

    None where the input does not record them.
    """
    h = run.history
    tokens, documents = int(h.tokens[-1].sum()), int(h.documents[-1].sum())
    padding = cut = None
    if h.padding is not None and tokens + int(h.padding[-1]):
        padding = int(h.padding[-1]) / (tokens + int(h.padding[-1]))
    if h.cut is not None and documents + int(h.cut[-1]):
        cut = int(h.cut[-1]) / (documents + int(h.cut[-1]))
    return padding, cut


@dataclass(frozen=True)
class Picture:
    """What a plan or run picture draws: shares per source over steps (top), epochs per source (bottom).

    ``shares[s][k]`` is source ``s``'s share of ``share_of`` over ``edges[k]..edges[k+1]``
    (a column sums to 1, or is 0 where nothing was delivered); ``epochs[s][j]`` the epochs
    of source ``s`` used by ``at[j]`` (``epochs_of == "documents"``: documents, where the
    sizes are not known). ``boundaries``: ``(x, label)`` where a stage begins; ``settled``: where
    every lane had entered it (lanes change stage one by one; audit logs tell when).
    """

    title: str
    sources: list[str]
    x_label: str
    edges: np.ndarray
    shares: np.ndarray
    share_of: str
    at: np.ndarray
    epochs: np.ndarray
    epochs_of: str
    boundaries: list[tuple[float, str]]
    settled: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _run_boundaries(run: Run, edges: np.ndarray) -> tuple[list[tuple[float, str]], list[float]]:
    """Where each stage began (the first lane in it), and (audit logs) where every lane had entered it."""
    h = run.history
    out, settled = [], []
    for i, name in enumerate(run.curriculum.stages):
        hit = np.flatnonzero(h.tokens[:, i, :].sum(axis=1))
        if not len(hit):
            continue
        k, step = int(hit[0]), int(h.steps[hit[0]])
        if h.every_step:
            entered = run.entered[i] if run.entered and i < len(run.entered) else None
            every = entered[1] if entered and entered[1] not in (None, step) else None
            out.append((float(edges[k]), f"{name} from step {step}" + (f" (every lane by {every})" if every else "")))
            if every:
                settled.append(float(every - 1))  # the start of that step, as a stage's line is drawn
        elif k == 0:
            out.append((float(edges[k]), f"{name} by step {step}"))
        else:
            out.append((float(edges[k]), f"{name} between steps {int(edges[k])} and {step}"))
    return out, settled


def run_picture(run: Run, title: str) -> Picture:
    """The run over its steps: token shares per step (audit logs) or per interval between checkpoints, and epochs."""
    c, h = run.curriculum, run.history
    tokens, documents = h.tokens.sum(axis=1), h.documents.sum(axis=1)  # [n, S], over stages
    edges = np.concatenate([[h.steps[0] - 1 if h.every_step else 0], h.steps]).astype(np.float64)
    delta = np.diff(np.concatenate([np.zeros((1, tokens.shape[1]), dtype=np.int64), tokens]), axis=0)
    at = np.concatenate([[edges[0]], h.steps]).astype(np.float64)
    cumulative = np.concatenate([np.zeros((1, documents.shape[1]), dtype=np.int64), documents]).T
    notes = []
    if all(c.sizes) and len(c.sizes) == len(c.sources):
        epochs, epochs_of = cumulative / np.asarray(c.sizes, dtype=np.float64)[:, None], "epochs"
    else:
        epochs, epochs_of = cumulative.astype(np.float64), "documents"
        notes.append("source sizes are not known here: documents drawn instead of epochs (pass --recipe for epochs)")
    if not h.every_step:
        notes.append(f"{len(h.steps)} checkpoints: shares are over each interval between them")
    boundaries, settled = _run_boundaries(run, edges)
    if settled:
        notes.append("dashed: the first lane enters a stage; dotted: every lane has (lanes change stage one by one)")
    shares = shares_of(delta, axis=1).T
    return Picture(title, list(c.sources), "global step", edges, shares, "tokens", at, epochs, epochs_of, boundaries, settled, notes)


@dataclass(frozen=True)
class StageBars:
    """A run with no history (one checkpoint): per stage, the run's shares beside the planned ones, and its epochs.

    ``delivered[i]`` / ``planned[i]``: stage ``i``'s shares per source in ``units[i]``
    (its weight_by; tokens where the plan is not known); ``epochs[i][s]`` epochs (or
    documents: ``epochs_of``) of source ``s`` used in stage ``i``.
    """

    title: str
    sources: list[str]
    stages: list[str]
    units: list[str]
    delivered: np.ndarray
    planned: np.ndarray | None
    epochs: np.ndarray
    epochs_of: str
    notes: list[str] = field(default_factory=list)


def stage_bars(run: Run, title: str) -> StageBars:
    """The totals of one checkpoint, per stage."""
    stages = stage_figures(run)[:-1]
    units = [st.weight_by or "tokens" for st in stages]
    delivered = np.array([shares_of(st.tokens if u == "tokens" else st.documents) for st, u in zip(stages, units)])
    planned = np.array([st.planned for st in stages]) if all(st.planned is not None for st in stages) else None
    sizes_known = all(run.curriculum.sizes) and len(run.curriculum.sizes) == len(run.curriculum.sources)
    epochs = np.array([st.epochs if sizes_known else st.documents.astype(np.float64) for st in stages])
    notes = ["one checkpoint: no history to draw over steps; pass several checkpoints or the audit logs for that"]
    if not sizes_known:
        notes.append("source sizes are not known here: documents drawn instead of epochs (pass --recipe for epochs)")
    return StageBars(
        title,
        list(run.curriculum.sources),
        [st.name for st in stages],
        units,
        delivered,
        planned,
        epochs,
        "epochs" if sizes_known else "documents",
        notes,
    )
