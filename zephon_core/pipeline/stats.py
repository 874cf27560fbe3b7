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

from zephon_core.checkpoint.state import LaneState
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.metrics import COUNTER_NAMES, Tally, sum_tallies


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
    ``counters``: the process-wide ``zephon_core.metrics.COUNTER_NAMES`` (cumulative).
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
    counters: Mapping[str, float]

    def scalars(self, prefix: str = "zephon/") -> dict[str, float]:
        """Flat ``name -> number`` for a metrics logger (docs/watching.md lists every name)."""
        out: dict[str, float] = {
            "stage": self.stage,
            "batches": self.batches,
            "padding_fraction": self.padding_fraction,
            "truncation_fraction": self.truncation_fraction,
        }
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


def _fractions(t: Tally) -> tuple[float, float]:
    width_tokens = t.rows and (t.total_tokens() + t.padding)
    stretches = sum(map(sum, t.documents)) + t.cut
    return (t.padding / width_tokens if width_tokens else 0.0), (t.cut / stretches if stretches else 0.0)


def lane_stage(work_source: WorkSource, lane: int, state: LaneState, C: int) -> int:
    """The stage of the chunk lane ``lane`` stands in (its last read chunk when it stands at a chunk's start)."""
    return work_source.stage_of(lane + state.cursor.last_chunk * C)


def pipeline_stats(work_source: WorkSource, C: int, own: Mapping[int, LaneState], run: Mapping[int, LaneState] | None,
                   counters: Mapping[str, float]) -> PipelineStats:
    """The snapshot of a pipeline whose owned lanes stand at ``own``, after a merged state whose lanes were ``run``."""
    names, sizes = [s.name for s in work_source.sources], [len(s) for s in work_source.sources]
    stage_names = work_source.stage_names()
    S = len(names)
    mine = sum_tallies([ls.tally for ls in own.values()], len(stage_names), S)
    whole = sum_tallies([ls.tally for ls in run.values()], len(stage_names), S) if run else None
    lanes = []
    for lane, ls in sorted(own.items()):
        i = lane_stage(work_source, lane, ls, C)
        lanes.append(LaneStats(lane, ls.delivered, i, stage_names[i]))
    run_tokens = [sum(r[s] for r in whole.tokens) for s in range(S)] if whole else None
    run_docs = [sum(r[s] for r in whole.documents) for s in range(S)] if whole else None
    run_total = sum(run_tokens) if run_tokens else 0
    sources = []
    for s in range(S):
        tok, doc = sum(r[s] for r in mine.tokens), sum(r[s] for r in mine.documents)
        sources.append(SourceStats(
            names[s], sizes[s], tok, doc, doc / sizes[s] if sizes[s] else 0.0,
            run_tokens[s] if run_tokens else None,
            run_docs[s] if run_docs else None,
            (run_docs[s] / sizes[s] if sizes[s] else 0.0) if run_docs else None,
            (run_tokens[s] / run_total if run_total else 0.0) if run_tokens else None,
        ))
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
        sources=tuple(sources),
        run_batches=sum(ls.delivered for ls in run.values()) if run else None,
        run_lanes=len(run) if run else 0,
        canonical_replicas=C,
        counted_since=mine.since,
        counters={k: counters.get(k, 0.0) for k in COUNTER_NAMES},
    )
