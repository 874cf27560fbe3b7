"""``StagedMixture``: a mixture whose weights, and set of sources, change at stage boundaries.

A curriculum of stages (warm-up -> main -> anneal, say) over one list of
sources. Stage ``i`` starts at a global chunk (given directly, in tokens, or
in optimizer steps, and converted deterministically: ``curriculum.schedule``)
and gives each of its sources a fixed share of every chunk: documents
(``weight_by="documents"``, as ``StaticMixture``) or tokens
(``weight_by="tokens"``: ``curriculum.token_index``). A source missing from a
stage is not read during it; one that comes back continues where it stopped.
Every source keeps one endless stream across all stages (a fresh permutation
per epoch, keyed by the seed and the source's place in the list), so a stage
change never repeats or skips a document within an epoch.

Chunk ``g`` stays a pure function of the definition and ``g``: lanes, cursors,
restore and the elastic guarantee are those of any work source. A staged
mixture of one document-weighted stage gives exactly the chunks of the
``StaticMixture`` of the same weights, and appending a stage that starts at
chunk ``G`` leaves every chunk before ``G`` unchanged: that is what lets a
checkpoint resume into a recipe with stages appended
(``checkpoint.compat``).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from zephon_core.arrays import gather_index
from zephon_core.curriculum.mixture_base import Mixture
from zephon_core.curriculum.schedule import Schedule
from zephon_core.curriculum.stage_report import describe_schedule
from zephon_core.curriculum.token_index import DocumentTokens, TokenCounter, TokenIndex, measure_tokens
from zephon_core.errors import ConfigError
from zephon_core.sources.base import Source
from zephon_core.validation import is_int, require_choice, require_int

WEIGHT_BY = ("documents", "tokens")
_STARTS = ("start_chunk", "start_tokens", "start_step")


@dataclass(frozen=True)
class Stage:
    """One stage of a ``StagedMixture``.

    Args:
        weights: source name -> weight from this stage's start on; a source left
            out (or weighted 0) is not read during the stage.
        name: shown by ``explain`` and named in errors and diffs (default ``stage<i>``).
        start_chunk, start_tokens, start_step: where the stage starts, exactly
            one of them (the first stage starts at 0 and takes none): a global
            chunk; the planned tokens before it; or optimizer steps, each
            ``tokens_per_step`` tokens (``StagedMixture``).
        weight_by: ``"documents"`` (weights are shares of each chunk's documents)
            or ``"tokens"`` (shares of its tokens).
    """

    weights: Mapping[str, float] = field(default_factory=dict)
    name: str | None = None
    start_chunk: int | None = None
    start_tokens: int | None = None
    start_step: int | None = None
    weight_by: str = "documents"


def check_stages(stages: Sequence[Stage], names: Sequence[str], where: str = "stages", *, tokens_per_step: int | None = None) -> list[Stage]:
    """The stages validated against the source ``names`` (no data is read); every problem names its stage and field."""
    if not stages:
        raise ConfigError(f"{where}: a staged mixture needs at least one stage")
    out: list[Stage] = []
    seen: dict[str, int] = {}
    used: set[str] = set()
    for i, st in enumerate(stages):
        if not isinstance(st, Stage):
            raise ConfigError(f"{where}[{i}]: expected a Stage, got {type(st).__name__}")
        name = st.name if st.name is not None else f"stage{i}"
        at = f"{where}[{i}] ({name!r})"
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}[{i}].name: must be a non-empty string, got {name!r}")
        if name in seen:
            raise ConfigError(f"{at}: name is also that of {where}[{seen[name]}]; give every stage its own name")
        seen[name] = i
        require_choice(st.weight_by, f"{at}.weight_by", WEIGHT_BY)
        given = [k for k in _STARTS if getattr(st, k) is not None]
        if i == 0 and any(getattr(st, k) for k in given):
            raise ConfigError(f"{at}: the first stage starts at the beginning of the run; remove its {given[0]}")
        if i > 0 and len(given) != 1:
            raise ConfigError(f"{at}: give exactly one of {', '.join(_STARTS[1:])} (or start_chunk), got {len(given) or 'none'}")
        for k in given:
            require_int(getattr(st, k), f"{at}.{k}", 0 if i == 0 else 1)
        if st.start_step and tokens_per_step is None:
            raise ConfigError(f"{at}.start_step: converting steps to tokens needs the rows per optimizer step (global_batch_size in a recipe, tokens_per_step in Python)")
        weights = _check_weights(st.weights, names, at)
        used |= {n for n, w in weights.items() if w > 0}
        out.append(replace(st, name=name, weights=weights) if i else Stage(weights, name, weight_by=st.weight_by))
    unused = [n for n in names if n not in used]
    if unused:
        raise ConfigError(f"{where}: source(s) {', '.join(map(repr, unused))} are in no stage; give them a weight in a stage or remove them")
    return out


def _check_weights(weights: Any, names: Sequence[str], at: str) -> dict[str, float]:
    if not isinstance(weights, Mapping) or not weights:
        raise ConfigError(f"{at}.weights: must map source names to weights, e.g. {{{names[0]!r}: 1.0}}")
    out: dict[str, float] = {}
    for key, w in weights.items():
        if key not in names:
            hint = difflib.get_close_matches(str(key), names, n=1)
            raise ConfigError(f"{at}.weights: unknown source {key!r}" + (f"; did you mean {hint[0]!r}?" if hint else f"; sources are {', '.join(names)}"))
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)) or not math.isfinite(w) or w < 0:
            raise ConfigError(f"{at}.weights.{key}: must be a finite number >= 0, got {w!r}")
        out[str(key)] = int(w) if is_int(w) else float(w)
    if not any(w > 0 for w in out.values()):
        raise ConfigError(f"{at}.weights: at least one source needs a weight > 0")
    return out


class StagedMixture(Mixture):
    """Sources mixed by stages (``Stage``), cut into chunks of about ``chunk_size`` documents.

    Args:
        sources: every source any stage reads, each with a distinct ``name``; a
            source's place in this list keys its permutations, so new sources
            are appended.
        stages: in order; the first starts at chunk 0.
        seed, chunk_size, exhausted, shuffle: as for ``StaticMixture``
            (``exhausted="stop"`` ends the curriculum when a source of the
            current stage runs out).
        block_size, block_window: the source orders of ``StaticMixture`` (block shuffle).
        tokens_per_step: tokens one optimizer step consumes (rows per step x
            ``seq_len + 1``), for stages that start at ``start_step``.
        token_counter: counts the tokens of text documents (``zephon_core.token_counter``),
            for token weights and token/step boundaries over text sources.
        token_counts: the token counts of ``sources``, already measured (``schedule.tokens`` of
            a mixture over the same sources): used instead of measuring them again.
    """

    kind = "staged_mixture"

    def __init__(
        self,
        sources: Sequence[Source],
        stages: Sequence[Stage],
        *,
        seed: int = 0,
        chunk_size: int = 64,
        exhausted: str = "repeat",
        shuffle: bool = True,
        block_size: int | None = None,
        block_window: int = 8,
        tokens_per_step: int | None = None,
        token_counter: TokenCounter | None = None,
        token_counts: Sequence[DocumentTokens] | None = None,
    ) -> None:
        super().__init__(sources, seed=seed, chunk_size=chunk_size, exhausted=exhausted, shuffle=bool(shuffle),
                         block_size=block_size, block_window=block_window)
        sources = self.sources
        names = [s.name for s in sources]
        for i, n in enumerate(names):
            if names.index(n) != i:
                raise ConfigError(f"sources {names.index(n)} and {i} are both named {n!r}; give every source a distinct name")
        if tokens_per_step is not None:
            tokens_per_step = require_int(tokens_per_step, "tokens_per_step", 1)
        self.stages = check_stages(stages, names, tokens_per_step=tokens_per_step)
        self.tokens_per_step = tokens_per_step
        sizes = [len(s) for s in sources]
        weights = [[st.weights.get(n, 0) for n in names] for st in self.stages]
        tokens = self._measure(token_counter, token_counts)
        indices = {}
        for s in range(len(sources)):
            if tokens is not None and any(st.weight_by == "tokens" and w[s] > 0 for st, w in zip(self.stages, weights)):
                indices[s] = TokenIndex(tokens[s], self._orders[s], f"source {names[s]!r}")
        self._schedule = Schedule(self.stages, weights, sizes, names, self.chunk_size, tokens, indices, tokens_per_step, self.exhausted)

    def _measure(self, counter: TokenCounter | None,
                 known: Sequence[DocumentTokens] | None) -> list[DocumentTokens] | None:
        """Token counts of every source, when a stage weighs tokens or starts at a token count (else None)."""
        if not any(st.weight_by == "tokens" or st.start_tokens is not None or st.start_step is not None for st in self.stages):
            return None
        if known is not None:
            counted, sizes = [len(t.lengths) for t in known], [len(s) for s in self.sources]
            if counted != sizes:
                raise ConfigError(f"token_counts: counts of {counted} documents for sources of {sizes}; "
                                  "give the counts of these sources, in their order")
            return list(known)
        return [measure_tokens(s, counter, f"source {s.name!r}") for s in self.sources]

    # -- the work source ------------------------------------------------------------
    @property
    def schedule(self) -> Schedule:
        """The resolved stages: first chunks, per-chunk shares, where every source stands."""
        return self._schedule

    @property
    def chunks_per_epoch(self) -> int:
        return self._schedule.chunks_per_epoch()

    @property
    def num_chunks(self) -> int | None:
        return self._schedule.num_chunks

    def _documents(self, live: Sequence[int]) -> list[list[np.ndarray]]:
        end = self._schedule.num_chunks
        garr = np.asarray(live, dtype=np.int64)
        per_source = []
        for s, order in enumerate(self._orders):
            index = self._schedule.indices.get(s)
            lo, hi = self._schedule.bounds(s, garr)
            if end is not None:  # "stop": no source of a live chunk has passed its first epoch; clip the last chunk
                hi = np.minimum(hi, len(self.sources[s]))
                lo = np.minimum(lo, hi)
            counts = hi - lo
            positions = gather_index(lo, counts)
            docs = (index or order).documents(positions) if counts.sum() else np.zeros(0, dtype=np.int64)
            per_source.append(np.split(docs, np.cumsum(counts)[:-1]))
        return per_source

    def definition(self) -> dict[str, Any]:
        """Everything that defines the chunks, for fingerprints and diffs."""
        sched = self._schedule
        stages = [_stage_definition(st, plan, sched.names, self.tokens_per_step)
                  for st, plan in zip(self.stages, sched.plans)]
        more: dict[str, Any] = {"stages": stages}
        if sched.tokens is not None:
            more["token_estimates"] = {n: dict(t.method) for n, t in zip(sched.names, sched.tokens)}
        return self._definition([{"name": s.name, **s.fingerprint()} for s in self.sources], **more)

    def planned_tokens(self, g: int) -> float | None:
        """Planned tokens before global chunk ``g`` (None where token counts are not measured)."""
        return self._schedule.planned_tokens(g)

    def stage_names(self) -> list[str]:
        return [plan.name for plan in self._schedule.plans]

    def stage_starts(self) -> list[int]:
        return [plan.start_chunk for plan in self._schedule.plans]

    def stage_shares(self) -> list[tuple[str, list[float]]]:
        out = []
        for st in self.stages:
            weights = [float(st.weights.get(s.name, 0)) for s in self.sources]
            total = math.fsum(weights)
            out.append((st.weight_by, [w / total for w in weights]))
        return out

    def describe(self) -> list[str]:
        return describe_schedule(self._schedule, self.stages, self.sources, self._header(), self.tokens_per_step)

    def _header(self) -> str:
        settings = self._settings(with_shuffle=True)
        return f"StagedMixture({settings}): {len(self.stages)} stage(s) over {len(self.sources)} source(s)"


def _stage_definition(st: Stage, plan: Any, names: Sequence[str], tokens_per_step: int | None) -> dict[str, Any]:
    start: dict[str, int] = {"chunk": plan.start_chunk}
    if st.start_tokens is not None:
        start = {"tokens": st.start_tokens}
    elif st.start_step is not None:
        assert tokens_per_step is not None
        start = {"step": st.start_step, "tokens_per_step": tokens_per_step}
    return {
        "name": st.name,
        "start_chunk": plan.start_chunk,
        "start": start,
        "weight_by": st.weight_by,
        "weights": {n: w for n, w in st.weights.items() if w > 0},
        "per_chunk": {n: c for n, c in zip(names, plan.per_chunk) if c},
    }
