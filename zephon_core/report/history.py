"""What a run delivered, step by step, and what it was asked for: the data ``zephon report`` prints and draws.

Two kinds of input give the same ``History``: batch audit logs (``integration.batch_log``: a row
per global step) and checkpoint states (a row per checkpoint, from the lanes' tallies,
``zephon_core.metrics.Tally``). Rows are cumulative ``[stage][source]`` tables, so the
run's totals are the last row and an interval's figures the difference of two rows;
the same run read either way gives the same totals.

What the run was asked for (``Curriculum``: names, each stage's planned shares, the
sources' sizes) comes from a state's definition or from the recipe's work source;
audit logs alone carry numbers only (``source 0``, ``stage 0``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon_core.checkpoint.state import parse_lanes
from zephon_core.curriculum.definition import parse_definition
from zephon_core.curriculum.journal import MixingJournal
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.errors import DataError
from zephon_core.integration.batch_log import LoggedBatch
from zephon_core.metrics import sum_tallies


@dataclass(frozen=True)
class Curriculum:
    """What a run was asked for, as far as its inputs tell.

    ``shares[i]`` is stage ``i``'s ``(weight_by, share per source)`` as
    ``WorkSource.stage_shares`` gives it (None: not known); ``sizes[s]`` the
    documents in source ``s`` (None: not known), read from ``sizes_from``;
    ``stage_starts`` the first global chunk of each stage (None: not known).
    """

    sources: list[str]
    stages: list[str]
    shares: list[tuple[str, list[float]]] | None = None
    sizes: list[int | None] = field(default_factory=list)
    sizes_from: str = ""
    stage_starts: list[int] | None = None

    def stage_of_chunk(self, g: int) -> int:
        """The stage global chunk ``g`` belongs to (0 when the starts are not known)."""
        if not self.stage_starts:
            return 0
        return int(np.searchsorted(np.asarray(self.stage_starts), g, side="right")) - 1

    def widened(self, n_stages: int, n_sources: int) -> Curriculum:
        """This curriculum with numbered stages and sources added up to ``n_stages`` x ``n_sources``."""
        sources = self.sources + [f"source {s}" for s in range(len(self.sources), n_sources)]
        stages = self.stages + [f"stage {i}" for i in range(len(self.stages), n_stages)]
        sizes = self.sizes + [None] * (len(sources) - len(self.sizes))
        if (len(sources), len(stages)) == (len(self.sources), len(self.stages)):
            return self
        # The plan of the stages it has stays known; with sources added, no stage's shares cover them all.
        shares = self.shares if len(sources) == len(self.sources) else None
        return Curriculum(sources, stages, shares, sizes, self.sizes_from, self.stage_starts)


def curriculum_of(work_source: WorkSource, where: str) -> Curriculum:
    """The curriculum of a work source (a recipe's), its sources' sizes counted from the data (``where`` names it)."""
    return Curriculum(
        [s.name for s in work_source.sources],
        work_source.stage_names(),
        work_source.stage_shares(),
        [len(s) for s in work_source.sources],
        where,
        work_source.stage_starts(),
    )


def curriculum_of_definition(definition: Mapping[str, Any]) -> Curriculum:
    """The curriculum a state's ``definition`` records; sizes where its sources' fingerprints count documents."""
    c = parse_definition(definition).work_source
    if c is None:
        return Curriculum([], ["mixture"], None, [], "", [0])
    where = "the checkpoint" if any(n is not None for n in c.sizes) else ""
    return Curriculum(c.names, [st.name or "mixture" for st in c.stages], c.stage_shares(), c.sizes, where,
                      c.stage_starts)


@dataclass(frozen=True)
class History:
    """A run's figures as of a sequence of global steps, cumulative from the start of the run.

    ``tokens[k][i][s]`` / ``documents[k][i][s]``: tokens and documents of source ``s``
    delivered in stage ``i`` up to and including step ``steps[k]``; ``batches[k]`` the
    batches by then. ``rows``, ``padding`` and ``cut`` (``Tally``'s) are None where the
    input does not record them. ``every_step``: a row for every step (audit logs), not
    only at checkpoints. ``since`` > 0 when some lane was counted from a later batch on.
    """

    steps: np.ndarray
    tokens: np.ndarray
    documents: np.ndarray
    batches: np.ndarray
    rows: np.ndarray | None
    padding: np.ndarray | None
    cut: np.ndarray | None
    every_step: bool
    since: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        """Stages x sources."""
        return int(self.tokens.shape[1]), int(self.tokens.shape[2])


@dataclass(frozen=True)
class Run:
    """A run as read: what it was asked for, what it delivered, and where its lanes stand now.

    ``lanes_in_stage[i]``: lanes whose latest position is in stage ``i`` (of
    ``lanes`` seen, of ``canonical_replicas``); ``read`` says what was read;
    ``notes`` are caveats the report prints under its table. ``entered[i]``
    (audit logs only): the step the first lane entered stage ``i`` and the one by
    which every lane had (None: not every lane has yet), or None for a stage not reached. ``journal``: a
    steered run's mixing decisions (its last stages, ``mix0`` on), None for a run of its recipe alone.
    """

    curriculum: Curriculum
    history: History
    read: str
    lanes_in_stage: list[int]
    lanes: int
    canonical_replicas: int
    notes: list[str] = field(default_factory=list)
    entered: list[tuple[int, int | None] | None] | None = None
    journal: MixingJournal | None = None


def stage_entries(batches: Mapping[tuple[int, int], LoggedBatch], per_lane: int, n_stages: int) -> list[tuple[int, int | None] | None]:
    """Per stage: the step the first lane entered it and the step by which every lane had (lanes move on one by one)."""
    never = 1 << 62
    first: dict[int, list[int]] = {}  # lane -> per stage, the first step it stood in that stage or a later one
    for (lane, index), b in batches.items():
        steps = first.setdefault(lane, [never] * n_stages)
        for i in range(b.stage + 1):
            steps[i] = min(steps[i], index // per_lane + 1)
    out: list[tuple[int, int | None] | None] = []
    for i in range(n_stages):
        reached = [steps[i] for steps in first.values() if steps[i] != never]
        out.append((min(reached), max(reached) if len(reached) == len(first) else None) if reached else None)
    return out


def history_of_states(
    states: Sequence[tuple[int, Mapping[str, Any]]], n_stages: int, n_sources: int
) -> tuple[History, list[str]]:
    """The history at the given ``(step, state)`` checkpoints (ascending steps), and any caveats."""
    tallies, batches, notes = [], [], []
    for step, state in states:
        lanes = parse_lanes(state)
        if any(ls.tally is None for ls in lanes.values()):
            notes.append(
                f"the checkpoint at step {step} is a version 1 state: its lanes carry no tally, "
                "so nothing is counted there"
            )
        tallies.append(sum_tallies([ls.tally for ls in lanes.values()], n_stages, n_sources))
        batches.append(sum(ls.delivered for ls in lanes.values()))
    # Stages or sources appended during the run: every checkpoint's tables to the widest.
    I = max([n_stages, *(len(t.tokens) for t in tallies)])  # noqa: E741
    S = max([n_sources, *(len(r) for t in tallies for r in t.tokens)])
    tables = [sum_tallies([t], I, S) for t in tallies]
    since = max(t.since for t in tables)
    if since:
        notes.append(f"some lanes were counted only from their batch {since} on (restored from a version 1 state)")
    return History(
        steps=np.array([s for s, _ in states], dtype=np.int64),
        tokens=np.array([t.tokens for t in tables], dtype=np.int64),
        documents=np.array([t.documents for t in tables], dtype=np.int64),
        batches=np.array(batches, dtype=np.int64),
        rows=np.array([t.rows for t in tables], dtype=np.int64),
        padding=np.array([t.padding for t in tables], dtype=np.int64),
        cut=np.array([t.cut for t in tables], dtype=np.int64),
        every_step=False,
        since=since,
    ), notes


def unique_batches(batches: Iterable[tuple[str, LoggedBatch]]) -> dict[tuple[int, int], LoggedBatch]:
    """Each batch once, by ``(lane, lane_index)``, from ``(where, line)`` pairs.

    Tensor- and pipeline-parallel peers log the batches they share, and a rank that
    resumed logs again what it had delivered after the checkpoint: the same batch,
    the same digest. One batch with two digests means logs of different runs.
    """
    out: dict[tuple[int, int], LoggedBatch] = {}
    seen_in: dict[tuple[int, int], str] = {}
    for where, b in batches:
        if b.stage < 0:
            raise DataError(
                f"{where}: an audit log of the first format (lane lane_index digest): it records no stage or "
                "per-source counts; report on the run's checkpoints instead"
            )
        key = (b.lane, b.lane_index)
        had = out.get(key)
        if had is not None and had.digest != b.digest:
            raise DataError(
                f"lane {b.lane} batch {b.lane_index} has digest {had.digest} in {seen_in[key]} "
                f"and {b.digest} in {where}: "
                "these logs are of different runs"
            )
        out[key] = b
        seen_in.setdefault(key, where)
    return out


def history_of_batches(
    batches: Mapping[tuple[int, int], LoggedBatch],
    per_lane: int,
    n_stages: int,
    n_sources: int,
    row_shape: tuple[int, int] | None = None,
) -> History:
    """The history, step by step, of the logged ``batches`` (``unique_batches``).

    The global step of a batch is ``lane_index // per_lane + 1`` (``per_lane``: batches
    of each lane per step, ``batches_per_step / canonical_replicas``). ``row_shape``
    (rows per batch, tokens per row) gives the padding; logs record no cuts.
    """
    bs = list(batches.values())
    steps = max((b.lane_index // per_lane for b in bs), default=-1) + 1
    S = max([n_sources, *(s + 1 for b in bs for s in b.tokens), *(s + 1 for b in bs for s in b.documents)])
    I = max([n_stages, *(b.stage + 1 for b in bs)])  # noqa: E741
    tokens = np.zeros((steps, I, S), dtype=np.int64)
    documents = np.zeros((steps, I, S), dtype=np.int64)
    count = np.zeros(steps, dtype=np.int64)
    for b in bs:
        k = b.lane_index // per_lane
        count[k] += 1
        for s, n in b.tokens.items():
            tokens[k, b.stage, s] += n
        for s, n in b.documents.items():
            documents[k, b.stage, s] += n
    tokens, documents, batches_so_far = tokens.cumsum(axis=0), documents.cumsum(axis=0), count.cumsum()
    rows = padding = None
    if row_shape is not None:
        rows = batches_so_far * row_shape[0]
        padding = rows * row_shape[1] - tokens.sum(axis=(1, 2))
    return History(
        np.arange(1, steps + 1, dtype=np.int64), tokens, documents, batches_so_far, rows, padding, None, every_step=True
    )


def short_steps(history: History, batches_per_step: int) -> list[int]:
    """Steps of an every-step history with fewer than ``batches_per_step`` batches (logs missing, a run cut short)."""
    per_step = np.diff(history.batches, prepend=0)
    return [int(s) for s, n in zip(history.steps, per_step) if n < batches_per_step]
