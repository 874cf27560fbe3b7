"""Where two curricula first differ: what a checkpoint of one may resume into.

A state restores into a pipeline of the same data definition. It also restores
into one whose curriculum differs only from some global chunk ``G`` on — a
stage appended, or a stage that had not started changed or removed — provided
its lanes have read nothing at or after ``G`` (``pipeline.resume`` checks
that part). ``divergence`` finds ``G``. A ``StaticMixture`` counts as a staged
mixture of one document-weighted stage (the same chunks), so a run started
without stages may resume with stages appended.

Everything else is a difference from the start: the seed, the chunk size,
the exhaustion policy, a source's content or place in the list (new sources
are appended), the token estimate of a source, and any change to the first
stage. Each difference is reported with the stage and the field it is in.

What the lanes have read is a matter of the checkpoint's own curriculum: a
lane inside a partly delivered shuffle window has read to the window's end as
*that* curriculum filled it, and from ``G`` on its chunks are not the new
one's. ``checkpoint_curriculum`` rebuilds it over this pipeline's sources.
Definitions are read with ``curriculum.definition`` (a static mixture as its
one stage).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from zephon_core.checkpoint.merge import diff_definitions
from zephon_core.curriculum.definition import Curriculum, parse_curriculum
from zephon_core.curriculum.stages import StagedMixture
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.errors import ConfigError, StateError

_GLOBAL = ("kind", "seed", "chunk_size", "exhausted", "shuffle", "order")
_DATA = ("start_chunk", "weight_by", "weights", "per_chunk")  # what a StaticMixture's one stage can be compared on


@dataclass(frozen=True)
class Divergence:
    """How two curriculum definitions differ."""

    chunk: int | None  # the first global chunk whose documents may differ; None: they may differ from the start
    stage: str | None  # the first stage that differs, e.g. "stages[2] ('anneal')"; None: not a stage
    reasons: list[str] = field(default_factory=list)


def _curriculum(ws: Mapping[str, Any]) -> Curriculum | None:
    try:
        return parse_curriculum(ws)
    except StateError:  # not a mixture this Zephon can read: it differs from the start
        return None


def as_staged(ws: Mapping[str, Any]) -> dict[str, Any] | None:
    """A mixture's definition in the staged form; None for a work source that is neither kind."""
    c = _curriculum(ws)
    return c.staged_form() if c is not None else None


def _label(stage: Mapping[str, Any], i: int, root: str) -> str:
    return f"{root}.stages[{i}] ({stage['name']!r})" if stage.get("name") else f"{root}.stages[{i}]"


def _view(stage: Mapping[str, Any], static: bool) -> dict[str, Any]:
    return {k: stage.get(k) for k in _DATA} if static else dict(stage)


def _stage_reasons(a: list[Any], b: list[Any], j: int, static: bool, root: str) -> list[str]:
    out: list[str] = []
    for i in range(j, max(len(a), len(b))):
        if i >= len(a):
            out.append(f"{_label(b[i], i, root)}: appended, from global chunk {b[i]['start_chunk']}")
        elif i >= len(b):
            out.append(f"{_label(a[i], i, root)}: only in the checkpoint's curriculum (removed), from global chunk {a[i]['start_chunk']}")
        else:
            out.extend(diff_definitions(_view(a[i], static), _view(b[i], static), _label(b[i] if b[i].get("name") else a[i], i, root)))
    return out


def _global_reasons(a: Mapping[str, Any], b: Mapping[str, Any], root: str) -> list[str]:
    out = [d for k in _GLOBAL[1:] for d in diff_definitions(a.get(k), b.get(k), f"{root}.{k}")]
    # Sources past the common length were appended (or, with the stages that read them, removed): the stages
    # before the divergence cannot read them, so only a change to a common one is a change from the start.
    old, new = a["sources"], b["sources"]
    m = min(len(old), len(new))
    if new[:m] != old[:m]:
        out.append(f"{root}.sources: the checkpoint's sources must stay, unchanged and in their order; append new ones after them")
        out += diff_definitions(old[:m], new[:m], f"{root}.sources")
    ta, tb = a.get("token_estimates") or {}, b.get("token_estimates") or {}
    for name in sorted(set(ta) & set(tb)):
        out += diff_definitions(ta[name], tb[name], f"{root}.token_estimates.{name}")
    return out


def divergence(old: Mapping[str, Any], new: Mapping[str, Any], root: str = "work_source") -> Divergence | None:
    """Where the work source ``new`` first differs from ``old`` (both definitions); None when they give the same chunks.

    Differences are worded as paths from ``root``, e.g. ``work_source.stages[1] ('main').weights.code: 0.3 vs 0.4``.
    """
    if old == new:
        return None
    a, b = as_staged(old), as_staged(new)
    if a is None or b is None or (a.get("static") and b.get("static")):  # two static mixtures differ from the start
        return Divergence(None, None, diff_definitions(old, new, root))
    reasons = _global_reasons(a, b, root)
    if reasons:
        return Divergence(None, None, reasons)
    static = bool(a.get("static") or b.get("static"))
    sa, sb = a["stages"], b["stages"]
    common = min(len(sa), len(sb))
    j = next((i for i in range(common) if _view(sa[i], static) != _view(sb[i], static)), common)
    if j == len(sa) == len(sb):
        return None
    label = _label(sb[j] if j < len(sb) else sa[j], j, root)
    reasons = _stage_reasons(sa, sb, j, static, root)
    if j == 0:
        return Divergence(None, label, [*reasons, f"{label}: the first stage starts the run; changing it changes the data from the start"])
    return Divergence(min(s[j]["start_chunk"] for s in (sa, sb) if j < len(s)), label, reasons)


def checkpoint_curriculum(old: Mapping[str, Any], like: WorkSource) -> StagedMixture:
    """The curriculum of the definition ``old`` (a checkpoint's), rebuilt over the sources of ``like``.

    ``like`` is this pipeline's staged or static mixture, whose sources begin with the checkpoint's
    (``divergence`` requires it); its token counts are reused. The result is checked against ``old``:
    it is returned only if ``divergence`` finds that it gives the same chunks.

    Raises:
        ConfigError: it cannot be rebuilt, with the reason (a source the checkpoint's stages read is
            gone, or the token counts it needs cannot be measured without the run's tokenizer).
    """
    staged = _curriculum(old)
    sources = list(getattr(like, "sources", None) or [])
    if staged is None or staged.staged_form() is None or not sources:
        raise ConfigError("the checkpoint's work source is not a staged or static mixture over this pipeline's sources")
    n = len(staged.sources)
    if n > len(sources):
        gone = ", ".join(repr(name) for name in staged.names[len(sources):])
        raise ConfigError(f"source(s) {gone} of the checkpoint's curriculum are not in this pipeline")
    schedule = getattr(like, "schedule", None)
    tokens = schedule.tokens if schedule is not None else None
    order = staged.order or {}
    stages = [st.stage(first=i == 0) for i, st in enumerate(staged.stages)]
    tokens_per_step = next((st.tokens_per_step for st in reversed(staged.stages[1:]) if st.tokens_per_step), None)
    rebuilt = StagedMixture(
        sources[:n], stages, seed=staged.seed, chunk_size=staged.chunk_size, exhausted=staged.exhausted,
        shuffle=staged.shuffle, block_size=order.get("block_size"), block_window=order.get("window", 8),
        tokens_per_step=tokens_per_step or getattr(like, "tokens_per_step", None),
        token_counts=tokens[:n] if tokens is not None else None,
    )
    if divergence(old, rebuilt.definition()) is not None:
        raise ConfigError("this pipeline's sources do not rebuild the checkpoint's curriculum")
    return rebuilt
