"""A mixture steered while the run trains: the recipe's curriculum with one stage per journaled decision.

``with_journal(base, journal)`` is the recipe's mixture (a ``StaticMixture`` reads as
its one document-weighted stage) with decision ``n`` of the journal appended as stage
``mix<n>``, from the decision's ``start_chunk``, weighing sources by the journal's
``weight_by``. Every chunk before a decision's start is the chunk the curriculum
without it gives, which is what lets a running pipeline switch to it at that chunk
and what makes the uninterrupted run over the final journal the reference of a
steered run. Its definition is the staged mixture's plus ``journal``: the
fingerprint of a state covers the decisions, and only states that hold a journal
change form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zephon_core.curriculum.definition import parse_curriculum
from zephon_core.curriculum.journal import MixingJournal
from zephon_core.curriculum.mixture_base import Mixture
from zephon_core.curriculum.stages import Stage, StagedMixture
from zephon_core.curriculum.token_index import DocumentTokens, TokenCounter
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.errors import ConfigError
from zephon_core.sources.base import Source


class JournaledMixture(StagedMixture):
    """A ``StagedMixture`` whose stages from the recipe's on are a journal's decisions (``with_journal``)."""

    def __init__(self, sources: Sequence[Source], stages: Sequence[Stage], journal: MixingJournal,
                 **kwargs: Any) -> None:
        super().__init__(sources, stages, **kwargs)
        self.journal = journal

    def definition(self) -> dict[str, Any]:
        return {**super().definition(), "journal": self.journal.to_json()}

    def describe(self) -> list[str]:
        return [*super().describe(), *describe_journal(self.journal)]


def describe_journal(journal: MixingJournal, most: int = 20) -> list[str]:
    """The journal as ``explain`` and ``report`` print it: a header, then a line per decision (the last ``most``)."""
    shown = journal.decisions[-most:]
    out = [f"mixing journal: {len(journal.decisions)} decision(s), weight_by={journal.weight_by}, "
           f"digest {journal.digest()[:12]}" + (f"; the last {most}:" if len(shown) < len(journal.decisions) else "")]
    first = len(journal.decisions) - len(shown)
    for n, d in enumerate(shown, first):
        params = ", ".join(f"{k}={v}" for k, v in d.params.items() if k != "entries" and v is not None)
        losses = ", ".join(f"{k} {'-' if v is None else f'{v:.4g}'}" for k, v in d.figures.get("mean_loss", {}).items())
        out.append(f"  {MixingJournal.stage_name(n)}: {d.summary()[:-1]}{', ' + params if params else ''}), "
                   f"inputs {d.inputs[:12]}" + (f"; loss per token: {losses}" if losses else ""))
    return out


def recipe_stages(base: WorkSource) -> list[Stage]:
    """The stages of the mixture ``base`` as given (a static mixture: its one stage named ``stage0``)."""
    curriculum = parse_curriculum(base.definition(), "work_source")
    if not isinstance(base, Mixture) or curriculum is None or curriculum.staged_form() is None:
        raise ConfigError(f"mixing steers a StaticMixture or StagedMixture over distinctly named sources, "
                          f"got {type(base).__name__}")
    return [st.stage(first=i == 0) for i, st in enumerate(curriculum.stages)]


def with_journal(base: WorkSource, journal: MixingJournal, token_counter: TokenCounter | None = None,
                 token_counts: Sequence[DocumentTokens] | None = None) -> StagedMixture:
    """``base`` (the recipe's mixture) with the journal's decisions appended as stages.

    Token counts are taken from ``token_counts``, else from ``base``'s schedule, else measured with
    ``token_counter`` (text sources under token weights). A decision that starts at or before the
    stage before it is refused (``ConfigError`` naming the stage).
    """
    if not journal.decisions:
        return base  # type: ignore[return-value]  # nothing decided yet: the recipe's own data, byte for byte
    stages = recipe_stages(base)
    assert isinstance(base, Mixture)  # recipe_stages refuses any other work source
    for n, d in enumerate(journal.decisions):
        weights = {name: w for name, w in d.weights.items() if w}
        name = MixingJournal.stage_name(n)
        stages.append(Stage(weights, name, start_chunk=d.start_chunk, weight_by=journal.weight_by))
    schedule = getattr(base, "schedule", None)
    known = token_counts if token_counts is not None else (schedule.tokens if schedule is not None else None)
    order = base.definition().get("order") or {}
    return JournaledMixture(
        base.sources, stages, journal, seed=base.seed, chunk_size=base.chunk_size, exhausted=base.exhausted,
        shuffle=base.shuffle,
        block_size=order.get("block_size"), block_window=order.get("window", 8),
        tokens_per_step=getattr(base, "tokens_per_step", None), token_counter=token_counter, token_counts=known,
    )
