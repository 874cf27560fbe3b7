"""The planned schedule as the data ``zephon explain --plot`` draws: pure functions of the work source.

Per stage, what each source gives a chunk (documents, and tokens where the work
source measured them); per source, the documents used before each chunk (the
schedule's stream positions); the global step a chunk is planned at (planned tokens
before it / tokens per step). Nothing reads a document. The result is a
``figures.Picture``, drawn on the same axes and in the same colours per source as
``zephon report`` draws a run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from zephon_core.curriculum.mixture import StaticMixture
from zephon_core.curriculum.stages import StagedMixture
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.errors import ConfigError
from zephon_core.report.figures import Picture, shares_of

SAMPLES = 240  # points per picture along the x axis (the shares are exact per stage; the epochs need no more)
_GENERIC_CHUNKS = 20_000  # a work source of another kind is drawn by computing its chunks, up to this many


def per_chunk(ws: WorkSource) -> tuple[np.ndarray, np.ndarray | None]:
    """Per stage and source: documents a chunk takes, and tokens (None where the work source measured none)."""
    if isinstance(ws, StagedMixture):
        sched = ws.schedule
        means = np.array([t.mean for t in sched.tokens]) if sched.tokens is not None else None
        docs, tokens = [], []
        for plan in sched.plans:
            c = np.asarray(plan.per_chunk, dtype=np.float64)
            if plan.by_tokens:
                assert means is not None
                docs.append(np.divide(c, means, out=np.zeros_like(c), where=means > 0))
                tokens.append(c)
            else:
                docs.append(c)
                tokens.append(c * means if means is not None else c)
        return np.array(docs), np.array(tokens) if means is not None else None
    if isinstance(ws, StaticMixture):
        return np.array([ws.counts], dtype=np.float64), None
    counts = [
        np.bincount(chunk.sources, minlength=len(ws.sources))
        for chunk in ws.chunks(ws.stage_starts())
        if chunk is not None
    ]
    return np.array(counts, dtype=np.float64), None


def positions(ws: WorkSource, gs: np.ndarray) -> np.ndarray:
    """``[source][j]``: documents of each source used before chunk ``gs[j]`` (its stream position there)."""
    gs = np.asarray(gs, dtype=np.int64)
    if isinstance(ws, StagedMixture):
        return np.array([ws.schedule.bounds(s, gs)[0] for s in range(len(ws.sources))])
    if isinstance(ws, StaticMixture):
        return np.outer(ws.counts, gs)
    end = int(gs.max(initial=0))
    if end > _GENERIC_CHUNKS:
        raise ConfigError(
            f"drawing {end} chunks of a {type(ws).__name__} means computing each; "
            f"draw fewer (at most {_GENERIC_CHUNKS})"
        )
    used = np.zeros((len(ws.sources), end + 1), dtype=np.int64)
    for chunk in ws.chunks(range(end)):
        if chunk is not None:
            used[:, chunk.index + 1] = np.bincount(chunk.sources, minlength=len(ws.sources))
    return used.cumsum(axis=1)[:, gs]


def planned_step(ws: WorkSource, g: int, tokens_per_step: float | None) -> float | None:
    """The global step chunk ``g`` is planned to start at (None where tokens are not planned)."""
    planned = ws.planned_tokens(g) if isinstance(ws, StagedMixture) and tokens_per_step else None
    return None if planned is None or not tokens_per_step else planned / tokens_per_step


def chunk_at_step(ws: WorkSource, step: float, tokens_per_step: float | None) -> int | None:
    """The first chunk planned at or after global step ``step`` (None where tokens are not planned)."""
    if planned_step(ws, 0, tokens_per_step) is None:
        return None
    lo, hi = 0, 1
    while (planned_step(ws, hi, tokens_per_step) or 0) < step:
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if (planned_step(ws, mid, tokens_per_step) or 0) < step:
            lo = mid + 1
        else:
            hi = mid
    return lo


def default_span(ws: WorkSource) -> int:
    """Chunks to draw when not told: a quarter past the last stage's start, or one epoch of a single stage."""
    starts = ws.stage_starts()
    span = starts[-1] + max(starts[-1] // 4, 8) if len(starts) > 1 else ws.chunks_per_epoch
    return min(span, ws.num_chunks) if ws.num_chunks is not None else span


def _samples(starts: Sequence[int], span: int) -> np.ndarray:
    """Chunks at which the epochs are drawn: evenly spread, and every stage start."""
    return np.unique(
        np.concatenate(
            [np.linspace(0, span, SAMPLES).round().astype(np.int64), [g for g in starts if g < span], [span]]
        )
    )


def start_label(name: str, x: float, in_steps: bool) -> str:
    """A stage's line at ``x``: steps count from 1 (as ``zephon report`` numbers them: step N is drawn from
    N - 1 to N), so a stage planned ``x`` steps in starts in step ``floor(x) + 1``; chunks count from 0."""
    return f"{name} from step {math.floor(x) + 1:,}" if in_steps else f"{name} from chunk {math.floor(x):,}"


def plan_picture(
    ws: WorkSource, title: str, *, tokens_per_step: float | None = None, span: int | None = None,
    until: float | None = None,
) -> Picture:
    """The plan of ``ws`` over its first ``span`` chunks (``default_span``).

    Drawn over planned global steps where tokens are planned, else over chunks; ``until``: the x axis
    ends there (a step within chunk ``span``, which ends later).
    """
    span = span or default_span(ws)
    starts = [g for g in ws.stage_starts() if g < span]
    names = ws.stage_names()[: len(starts)]
    docs, tokens = per_chunk(ws)
    share_of = "tokens" if tokens is not None else "documents"
    shares = shares_of((tokens if tokens is not None else docs)[: len(starts)], axis=1).T
    in_steps = planned_step(ws, 0, tokens_per_step) is not None

    def x(g: int) -> float:
        return float(planned_step(ws, g, tokens_per_step)) if in_steps else float(g)  # type: ignore[arg-type]

    at = _samples(starts, span)
    sizes = np.array([len(s) for s in ws.sources], dtype=np.float64)
    epochs = positions(ws, at) / sizes[:, None]
    boundaries = [(x(g), start_label(name, x(g), in_steps)) for g, name in zip(starts, names)]
    end = x(span) if until is None else min(x(span), until)
    x_label = f"global step (planned, {tokens_per_step:,.0f} tokens a step)" if in_steps else "global chunk"
    notes = (
        []
        if tokens is not None
        else ["no stage weighs tokens: the work source plans no token counts, so shares are of documents"]
    )
    if tokens_per_step is None and tokens is not None:
        notes.append("steps unknown (no global_batch_size, seq_len): drawn over chunks")
    by_documents = [name for name, (by, _) in zip(names, ws.stage_shares()) if by == "documents"]
    if tokens is not None and by_documents:
        notes.append(f"{', '.join(by_documents)} weigh{'s' if len(by_documents) == 1 else ''} documents: "
                     "the token shares drawn are planned from the sources' mean document lengths")
    return Picture(
        title,
        [s.name for s in ws.sources],
        x_label,
        np.array([*(x(g) for g in starts), end]),
        shares,
        share_of,
        np.array([x(int(g)) for g in at]),
        epochs,
        "epochs",
        boundaries,
        notes=notes,
    )
