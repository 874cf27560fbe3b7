"""A staged mixture's schedule: where each stage starts in the global chunk sequence, and where every source stands.

Stage ``i`` covers global chunks ``start[i] .. start[i+1] - 1``. Within it,
source ``s`` advances by a fixed amount per chunk (``Track``): ``count``
documents (``weight_by="documents"``), or a quota of ``q`` tokens, chunk ``g``
then taking the documents whose first token lies in its quota
(``weight_by="tokens"``). The stream position of every source at every stage
start is computed once, from the stage before it, so the position at any
chunk is a closed form: chunks stay pure functions of their number, and a
source continues across a boundary exactly where it stood.

A boundary given in tokens (or steps, converted to tokens) becomes the first
chunk by which the *planned* tokens reach it: per chunk, a token stage plans
its quota sum and a document stage the expected tokens of its counts (mean
document lengths, ``token_index.measure_tokens``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from zephon_core.curriculum.mixture_base import largest_remainder
from zephon_core.curriculum.token_index import DocumentTokens, TokenIndex
from zephon_core.errors import ConfigError


class StageLike(Protocol):
    """What a schedule reads of a stage (``stages.Stage``)."""

    @property
    def name(self) -> str | None: ...
    @property
    def weight_by(self) -> str: ...
    @property
    def start_chunk(self) -> int | None: ...
    @property
    def start_tokens(self) -> int | None: ...
    @property
    def start_step(self) -> int | None: ...


@dataclass(frozen=True)
class Track:
    """One source during one stage: its stream position at the stage's first chunk and its advance per chunk."""

    start: int
    per_chunk: int  # documents, or tokens when by_tokens; 0: not read during this stage
    by_tokens: bool = False
    x0: int = 0  # tokens before `start` (by_tokens)

    def at(self, rel: np.ndarray, index: TokenIndex | None) -> np.ndarray:
        """The stream position at the start of chunk ``stage start + rel``."""
        rel = np.asarray(rel, dtype=np.int64)
        if not self.per_chunk:
            return np.full(rel.shape, self.start, dtype=np.int64)
        if not self.by_tokens:
            return self.start + rel * self.per_chunk
        assert index is not None
        # max: documents before `start` that hold no token share its token offset; they were used already.
        return np.maximum(self.start, index.position_at(self.x0 + rel * self.per_chunk))


@dataclass(frozen=True)
class StagePlan:
    """A stage, resolved: its first chunk, what each source gives per chunk, where each source starts."""

    index: int
    name: str
    start_chunk: int
    by_tokens: bool
    per_chunk: tuple[int, ...]  # per source: documents or tokens per chunk (0: not in the stage)
    tracks: tuple[Track, ...]
    tokens_per_chunk: float | None  # planned tokens per chunk, None where token counts are not measured
    tokens_before: float | None  # planned tokens before start_chunk


class Schedule:
    """The resolved stages of a staged mixture over sources of ``sizes`` documents.

    ``stages`` are validated ``Stage`` objects, ``weights[i][s]`` stage ``i``'s
    weight of source ``s`` (0: absent), ``tokens[s]`` the measured token counts
    (None when no stage needs them), ``indices[s]`` the token index of a source
    some token stage reads.
    """

    def __init__(self, stages: Sequence[StageLike], weights: Sequence[Sequence[float]], sizes: Sequence[int], names: Sequence[str],
                 chunk_size: int, tokens: Sequence[DocumentTokens] | None, indices: dict[int, TokenIndex],
                 tokens_per_step: int | None, exhausted: str) -> None:
        self.sizes = list(sizes)
        self.names = list(names)
        self.tokens = tokens
        self.indices = indices
        self.plans: list[StagePlan] = []
        for i, stage in enumerate(stages):
            self.plans.append(self._plan(i, stage, weights[i], chunk_size, tokens_per_step))
        self.starts = np.array([p.start_chunk for p in self.plans], dtype=np.int64)
        self.num_chunks = None if exhausted == "repeat" else self._end()

    # -- resolving ---------------------------------------------------------------------
    def _plan(self, i: int, stage: StageLike, weights: Sequence[float], chunk_size: int, tokens_per_step: int | None) -> StagePlan:
        name = stage.name or f"stage{i}"
        where = f"stages[{i}] ({name!r})"
        by_tokens = stage.weight_by == "tokens"
        start, tokens_before = self._start(i, stage, where, tokens_per_step)
        if i == 0:
            positions = [0] * len(self.sizes)
        else:
            prev = self.plans[-1]
            rel = np.array([start - prev.start_chunk], dtype=np.int64)
            positions = [int(t.at(rel, self.indices.get(s))[0]) for s, t in enumerate(prev.tracks)]
        per_chunk = self._per_chunk(where, weights, chunk_size, by_tokens)
        tracks = []
        for s, (pos, c) in enumerate(zip(positions, per_chunk)):
            x0 = int(self.indices[s].cumstart(np.array([pos]))[0]) if by_tokens and c else 0
            tracks.append(Track(pos, c, by_tokens and c > 0, x0))
        if self.tokens is None:
            per_chunk_tokens = None
        elif by_tokens:
            per_chunk_tokens = float(sum(per_chunk))
        else:
            per_chunk_tokens = math.fsum(c * t.mean for c, t in zip(per_chunk, self.tokens))
        return StagePlan(i, name, start, by_tokens, tuple(per_chunk), tuple(tracks), per_chunk_tokens, tokens_before)

    def _start(self, i: int, stage: StageLike, where: str, tokens_per_step: int | None) -> tuple[int, float | None]:
        """The stage's first chunk, and the planned tokens before it."""
        if i == 0:
            return 0, 0.0 if self.tokens is not None else None
        prev = self.plans[-1]
        chunk, tokens, step = stage.start_chunk, stage.start_tokens, stage.start_step
        if step is not None:
            assert tokens_per_step is not None
            tokens = step * tokens_per_step
        if chunk is None:
            assert tokens is not None and prev.tokens_per_chunk is not None and prev.tokens_before is not None
            chunk = prev.start_chunk + math.ceil((tokens - prev.tokens_before) / prev.tokens_per_chunk)
            if chunk <= prev.start_chunk:
                raise ConfigError(
                    f"{where}: starts at {tokens} tokens, not after stages[{i - 1}] ({prev.name!r}), which starts at chunk "
                    f"{prev.start_chunk} (~{prev.tokens_before:.4g} tokens); a stage must last at least one chunk"
                )
        elif chunk <= prev.start_chunk:
            raise ConfigError(f"{where}: start_chunk={chunk} must be after stages[{i - 1}] ({prev.name!r}), which starts at chunk {prev.start_chunk}")
        if prev.tokens_per_chunk is None or prev.tokens_before is None:
            return chunk, None
        return chunk, prev.tokens_before + (chunk - prev.start_chunk) * prev.tokens_per_chunk

    def _per_chunk(self, where: str, weights: Sequence[float], chunk_size: int, by_tokens: bool) -> list[int]:
        active = [s for s, w in enumerate(weights) if w > 0]
        total = chunk_size
        if by_tokens:
            assert self.tokens is not None
            share = math.fsum(weights[s] for s in active)
            # The token budget for which a chunk holds chunk_size documents on average.
            total = max(1, round(chunk_size / math.fsum(weights[s] / share / self.tokens[s].mean for s in active)))
        shares = largest_remainder([weights[s] for s in active], total)
        out = [0] * len(weights)
        for s, c in zip(active, shares):
            if c == 0:
                fix = "raise chunk_size or the weight" if by_tokens else (
                    f"raise chunk_size to at least {math.ceil(math.fsum(weights[a] for a in active) / weights[s])}")
                unit = "tokens" if by_tokens else "documents"
                raise ConfigError(f"{where}: weights.{self.names[s]} is too small to get one of the {total} {unit} of a chunk; {fix}")
            out[s] = c
        return out

    def _end(self) -> int | None:
        """With ``exhausted="stop"``: one past the chunk in which a source of its stage passes its last document."""
        ends = []
        for i, plan in enumerate(self.plans):
            stop = int(self.starts[i + 1]) if i + 1 < len(self.plans) else None
            for s, t in enumerate(plan.tracks):
                if not t.per_chunk or t.start >= self.sizes[s]:
                    continue
                if t.by_tokens:
                    last_start = int(self.indices[s].cumstart(np.array([self.sizes[s] - 1]))[0])
                    last = plan.start_chunk + max(0, (last_start - t.x0) // t.per_chunk)
                else:
                    last = plan.start_chunk - 1 + -(-(self.sizes[s] - t.start) // t.per_chunk)
                if stop is None or last < stop:
                    ends.append(last + 1)
        return min(ends) if ends else None

    # -- querying ----------------------------------------------------------------------
    def stage_of(self, gs: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, gs, side="right") - 1

    def bounds(self, s: int, gs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Stream positions of source ``s`` at the start and the end of each chunk ``gs``."""
        lo = np.empty_like(gs)
        hi = np.empty_like(gs)
        stage = self.stage_of(gs)
        for i in np.unique(stage).tolist():
            sel = stage == i
            rel = gs[sel] - self.starts[i]
            both = self.plans[i].tracks[s].at(np.concatenate([rel, rel + 1]), self.indices.get(s))
            lo[sel], hi[sel] = both[: len(rel)], both[len(rel) :]
        return lo, hi

    def position(self, s: int, g: int) -> int:
        """Documents source ``s`` has used before chunk ``g`` (its stream position there)."""
        return int(self.bounds(s, np.array([g], dtype=np.int64))[0][0])

    def chunks_per_epoch(self) -> int:
        out = 1
        for plan in self.plans:
            for s, t in enumerate(plan.tracks):
                if t.per_chunk:
                    size = self.indices[s].total if t.by_tokens else self.sizes[s]
                    out = max(out, -(-size // t.per_chunk))
        return out

    def planned_tokens(self, g: int) -> float | None:
        """Planned tokens before chunk ``g`` (None where token counts are not measured)."""
        plan = self.plans[int(self.stage_of(np.array([g]))[0])]
        if plan.tokens_before is None or plan.tokens_per_chunk is None:
            return None
        return plan.tokens_before + (g - plan.start_chunk) * plan.tokens_per_chunk
