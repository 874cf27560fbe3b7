"""``PipelineStats``: what a pipeline has delivered and what it cost, as one small snapshot.

Everything here is computed from state the pipeline already holds: the lanes'
tallies (``zephon_core.metrics.Tally``), their cursors, the last merged state's
lanes and the process-wide ``COUNTERS``. Taking a snapshot reads no data and
talks to no other rank, so it is cheap enough for every step.

Run-wide figures come from the lanes of the last state this pipeline merged or
restored (``checkpoint()`` with ``world_size > 1`` returns every lane): the
tallies of all lanes add up to what the whole run delivered up to that step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from zephon_core.batch import Cursor
from zephon_core.checkpoint.state import LaneState
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.metrics import Tally, sum_tallies


@dataclass(frozen=True)
class SourceStats:
    """One source's figures: delivered by this pipeline's lanes, and by the whole run (None before a merged state)."""

    name: str
    size: int  # documents in the source (one epoch)
    tokens: int
    documents: int
    epochs: float  # documents / size: epochs of this source the lanes have used
    run_tokens: int | None
    run_documents: int | None
    run_epochs: float | None
    run_share: float | None  # this source's share of the run's tokens


@dataclass(frozen=True)
class LaneStats:
    """One owned lane: batches delivered, and the stage of the chunk it stands in."""

    lane: int
    delivered: int
    stage: int
    stage_name: str


@dataclass(frozen=True)
class PipelineStats:
    """A snapshot of one pipeline (``Pipeline.stats()``).

    ``padding_fraction``: pad tokens / tokens of the delivered rows.
    ``truncation_fraction``: row stretches that continue a document cut at a row
    boundary / all stretches (each such document's later tokens do not see its earlier
    ones). ``counted_since`` > 0 when a lane was restored from a state that carried no
    tally: its figures count from that many batches on. ``run_*`` figures are as of the
    last merged (or restored) state and cover ``run_lanes`` lanes of ``canonical_replicas``.
    ``dropped_tokens``: tokens of documents cut to one row and dropped (``overlong="truncate"``).
    ``counters``: the process-wide ``zephon_core.metrics.COUNTER_NAMES`` (cumulative);
    ``wait_s`` is this pipeline's own.
    """

    batches: int  # delivered by this pipeline's lanes (across restores)
    rows: int
    padding_fraction: float
    truncation_fraction: float
    stage: int  # the furthest stage any owned lane is in
    stage_name: str
    lanes: tuple[LaneStats, ...]
    sources: tuple[SourceStats, ...]
    run_batches: int | None
    run_lanes: int
    canonical_replicas: int
    counted_since: int
    wait_s: float  # seconds this pipeline's caller waited inside next()
    counters: Mapping[str, float]
    dropped_tokens: int = 0

    def scalars(self, prefix: str = "zephon/") -> dict[str, float]:
        """Flat ``name -> number`` for a metrics logger (docs/watching.md lists every name)."""
        out: dict[str, float] = {
            "stage": self.stage,
            "batches": self.batches,
            "padding_fraction": self.padding_fraction,
            "truncation_fraction": self.truncation_fraction,
            "wait_s": self.wait_s,
        }
        if self.dropped_tokens:
            out["dropped_tokens"] = self.dropped_tokens
        for s in self.sources:
            out[f"tokens/{s.name}"] = s.tokens
            out[f"documents/{s.name}"] = s.documents
            out[f"epochs/{s.name}"] = s.epochs
            if s.run_tokens is not None:
                out[f"run/tokens/{s.name}"] = s.run_tokens
                out[f"run/epochs/{s.name}"] = float(s.run_epochs or 0.0)
                out[f"run/share/{s.name}"] = float(s.run_share or 0.0)
        if self.run_batches is not None:
            out["run/batches"] = self.run_batches
        for name, value in self.counters.items():
            out[name] = value
        return {prefix + k: float(v) for k, v in out.items()}


@dataclass(frozen=True)
class RunFigures:
    """The lanes of a merged (or restored) state, summed once when it arrives."""

    tally: Tally
    batches: int
    lanes: int


def run_figures(work_source: WorkSource, lanes: Mapping[int, LaneState]) -> RunFigures:
    whole = sum_tallies((ls.tally for ls in lanes.values()), len(work_source.stage_names()), len(work_source.sources))
    return RunFigures(whole, sum(ls.delivered for ls in lanes.values()), len(lanes))


def _fractions(t: Tally) -> tuple[float, float]:
    width_tokens = t.rows and (t.total_tokens() + t.padding)
    stretches = sum(map(sum, t.documents)) + t.cut
    return (t.padding / width_tokens if width_tokens else 0.0), (t.cut / stretches if stretches else 0.0)


def lane_stage(work_source: WorkSource, lane: int, cursor: Cursor, C: int) -> int:
    """The stage of the chunk lane ``lane`` stands in at ``cursor`` (``Cursor.last_chunk``): where its batches count."""
    return work_source.stage_of(lane + cursor.last_chunk * C)


def _per_source(t: Tally, n_sources: int) -> tuple[list[int], list[int]]:
    tokens, documents = [0] * n_sources, [0] * n_sources
    for tok, doc in zip(t.tokens, t.documents):
        for s, (a, b) in enumerate(zip(tok, doc)):
            tokens[s] += a
            documents[s] += b
    return tokens, documents


def _sources(work_source: WorkSource, mine: Tally, run: RunFigures | None) -> tuple[SourceStats, ...]:
    S = len(work_source.sources)
    tokens, docs = _per_source(mine, S)
    run_tokens, run_docs = _per_source(run.tally, S) if run else ([], [])
    run_total = sum(run_tokens)
    out = []
    for s, src in enumerate(work_source.sources):
        n = len(src)
        rt, rd = (run_tokens[s], run_docs[s]) if run else (None, None)
        out.append(SourceStats(
            src.name, n, tokens[s], docs[s], docs[s] / n if n else 0.0, rt, rd,
            None if rd is None else (rd / n if n else 0.0),
            None if rt is None else (rt / run_total if run_total else 0.0),
        ))
    return tuple(out)


def pipeline_stats(work_source: WorkSource, C: int, own: Mapping[int, LaneState], run: RunFigures | None,
                   counters: Mapping[str, float], waited_s: float) -> PipelineStats:
    """The snapshot of a pipeline whose owned lanes stand at ``own``, after a merged state summed as ``run``."""
    stage_names = work_source.stage_names()
    tallies = [ls.tally for ls in own.values()]
    only = tallies[0] if len(tallies) == 1 else None  # one lane per group (C == dp_degree): nothing to add up
    mine = only if only is not None else sum_tallies(tallies, len(stage_names), len(work_source.sources))
    lanes = []
    for lane, ls in sorted(own.items()):
        i = lane_stage(work_source, lane, ls.cursor, C)
        lanes.append(LaneStats(lane, ls.delivered, i, stage_names[i]))
    padding, truncation = _fractions(mine)
    stage = max((ln.stage for ln in lanes), default=0)
    return PipelineStats(
        batches=sum(ls.delivered for ls in own.values()),
        rows=mine.rows,
        padding_fraction=padding,
        truncation_fraction=truncation,
        stage=stage,
        stage_name=stage_names[stage],
        lanes=tuple(lanes),
        sources=_sources(work_source, mine, run),
        run_batches=run.batches if run else None,
        run_lanes=run.lanes if run else 0,
        canonical_replicas=C,
        counted_since=mine.since,
        wait_s=waited_s,
        counters=counters,
        dropped_tokens=mine.truncated,
    )
