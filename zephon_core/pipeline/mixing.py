"""A pipeline whose mixture the run steers by its own losses (``MixingLoader``), resumable exactly.

Every ``interval`` a controller (``curriculum.controllers``) gets figures identical on every
rank and proposes the next weights; ``decide`` bounds and quantizes them and turns them into a
stage of the curriculum (``curriculum.steered.with_journal``) that starts at global chunk

    G = max(F + margin_chunks, the last decision's chunk + 1)

where ``F`` is the read frontier at that step: one past the last global chunk any lane's
*delivered* rows depend on (``Pipeline.read_frontier``, reduced with MAX over the
data-parallel groups). ``F`` is a function of the step and the data contract only (the elastic
guarantee fixes every lane's delivered position at a global step), never of prefetch depth,
threads or processes. Batches read ahead are dropped: the pipeline is rebuilt from its lanes'
delivered positions (``Pipeline.switched``), whose restore refuses, loudly, a stage that starts
at a chunk a lane has read. The decision is journaled in the data definition, so a checkpoint
holds it and a resume on any data-parallel degree replays it (``restore``). What the next decision
depends on besides (the step the controller was last asked at, its state after proposals that changed
nothing, the losses of the interval under way) is the state's steering clock (``checkpoint.steering``), so
a resumed run decides exactly as the uninterrupted one, wherever the checkpoint falls.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_core.batch import Batch
from zephon_core.checkpoint.merge import diff_definitions
from zephon_core.checkpoint.state import fingerprint_of
from zephon_core.checkpoint.steering import Clock, clock_of
from zephon_core.checkpoint.surgery import surgery_journal_of
from zephon_core.curriculum.controller_registry import controller_from, naming
from zephon_core.curriculum.controllers import MixingController, MixingInputs, bounded
from zephon_core.curriculum.definition import parse_definition
from zephon_core.curriculum.journal import DENOMINATOR, Decision, MixingJournal, quantize
from zephon_core.curriculum.steered import with_journal
from zephon_core.curriculum.token_index import DocumentTokens, TokenCounter
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.errors import ConfigError, StateError
from zephon_core.lane.docops import token_counter
from zephon_core.lane.ops import TokenizeOp
from zephon_core.pipeline.builder import Pipeline
from zephon_core.validation import require_choice, require_int


@dataclass(frozen=True)
class Mixing:
    """How a run steers its mixture.

    Args:
        controller: proposes the weights (``IdentityController``, ``ScheduleController``, ``OdmController``, or one
            of your own: ``curriculum.controller_registry``).
        interval_steps, interval_tokens: a decision every so many optimizer steps, or every so many
            trained (loss) tokens; exactly one.
        min_share: the least share any source gets (0: a source may be left out).
        max_change: the most any source's share moves in one decision.
        margin_chunks: global chunks between the read frontier and a decision's first chunk.
        weight_by: ``"tokens"`` (decided weights are token shares) or ``"documents"``.
        token_counter: counts text documents' tokens for token weights (``zephon_core.token_counter``).
    """

    controller: MixingController
    interval_steps: int | None = None
    interval_tokens: int | None = None
    min_share: float = 0.0
    max_change: float = 1.0
    margin_chunks: int = 0
    weight_by: str = "tokens"
    token_counter: TokenCounter | None = None

    def __post_init__(self) -> None:
        if (self.interval_steps is None) == (self.interval_tokens is None):
            raise ConfigError("mixing: give exactly one of interval_steps and interval_tokens")
        for key in ("interval_steps", "interval_tokens"):
            if getattr(self, key) is not None:
                require_int(getattr(self, key), f"mixing.{key}", 1)
        require_int(self.margin_chunks, "mixing.margin_chunks", 0)
        require_choice(self.weight_by, "mixing.weight_by", ("tokens", "documents"))
        if not 0 <= self.min_share < 1 or not 0 < self.max_change <= 1:
            raise ConfigError(f"mixing: min_share must be in [0, 1) and max_change in (0, 1], got {self.min_share} "
                              f"and {self.max_change}")

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str = "mixing", base: Path | None = None,
                   token_counter: TokenCounter | None = None) -> Mixing:
        """``Mixing`` from recipe keys (a ``[mixing]`` table; paths relative to ``base``): the common keys
        (``controller_registry.COMMON_KEYS``) and the chosen controller's own (``controller_from`` checks them)."""
        controller = controller_from(table, where, base)
        plain = ("interval_steps", "interval_tokens", "margin_chunks", "weight_by")
        settings = {k: table[k] for k in plain if k in table}
        for k in ("min_share", "max_change"):
            if k in table:
                settings[k] = float(table[k])
        return cls(controller, token_counter=token_counter, **settings)


@dataclass(frozen=True)
class LocalFigures:
    """What one pipeline contributes to a decision: its read frontier (reduce with MAX over data-parallel groups)
    and the tokens of each source its lanes delivered (reduce with SUM over data-parallel groups)."""

    frontier: int
    delivered_tokens: tuple[int, ...]

    def slots(self, ranks: int, rank: int) -> list[int]:
        """These figures as the integers one all-reduce (SUM) over ``ranks`` ranks combines: the delivered tokens,
        then each rank's frontier in its own slot, whose maximum is the MAX reduction (``from_slots``)."""
        out = [*self.delivered_tokens] + [0] * ranks
        out[len(self.delivered_tokens) + rank] = self.frontier
        return out

    @staticmethod
    def from_slots(summed: Sequence[int], n_sources: int) -> LocalFigures:
        """The figures of every rank from ``slots`` summed over them."""
        return LocalFigures(max(summed[n_sources:]), tuple(summed[:n_sources]))

    @staticmethod
    def reduced(parts: Sequence[LocalFigures]) -> LocalFigures:
        """The figures of every data-parallel group combined, as the adapters' all-reduce does."""
        return LocalFigures(max(p.frontier for p in parts), tuple(map(sum, zip(*(p.delivered_tokens for p in parts)))))


def counter_of(pipeline: Pipeline) -> TokenCounter | None:
    """Counts a document's tokens as ``pipeline``'s tokenize operator makes them (None: it has none)."""
    op = next((op for op in pipeline.operators if isinstance(op, TokenizeOp)), None)
    return None if op is None else token_counter(op.tokenizer, bos_id=op.bos_id, eos_id=op.eos_id)


def replay(pipeline: Pipeline, state: Mapping[str, Any], token_counter: TokenCounter | None = None) -> Pipeline:
    """``pipeline`` (built from the run's recipe) over its mixture with ``state``'s journal replayed: the data
    the steered run trained on (``pipeline`` itself when the state holds no journal). Nothing is restored."""
    journal = parse_definition(state["definition"]).journal
    if journal is None or not journal.decisions:
        return pipeline
    fix = "use the recipe of the run that wrote the state"
    try:
        ws = with_journal(pipeline.work_source, journal, token_counter or counter_of(pipeline))
    except ConfigError as e:  # the decided stages do not even fit after the recipe's own (a stage added since)
        raise ConfigError(f"the state's mixing journal does not replay over the recipe's mixture: {e}; {fix}") from None
    differs = diff_definitions(state["definition"]["work_source"], ws.definition(), "work_source")
    if differs:
        raise ConfigError(f"the recipe's mixture with the state's journal replayed is not the state's: {differs[0]}; "
                          f"{fix}")
    return pipeline.with_work_source(ws)


def with_history(pipeline: Pipeline, state: Mapping[str, Any], token_counter: TokenCounter | None = None, *,
                 check: bool = True, where: str = "") -> Pipeline:
    """``pipeline`` (built from the run's recipe) as the run that wrote ``state`` (a checked state) had it: its mixing
    journal replayed (``replay``) and its surgery journal set (``pipeline.surgery``). Nothing is restored.

    The one way a reader of a state rebuilds the run's pipeline (``zephon quarantine``, ``ledger``, ``trace``,
    ``verify-elastic``, ``explain``, ``diff``, ``report``), so a steered run's state reads and restores as any other,
    and no part of its history is left out. What cannot be applied is refused, never read as other data: a journal
    the recipe's mixture does not fit (ConfigError) and, with ``check``, a state ``restore`` would refuse for this
    data (StateError, the resume verdict's line; without ``check`` the caller asks for the verdict itself). The
    message starts with ``where`` (the state's file) when given.
    """
    try:
        p = replay(pipeline, state, token_counter)
        if check and state["fingerprint"] != fingerprint_of(p.definition()):
            verdict = p.resume_verdict(state)
            if not verdict.accepted:
                raise StateError(verdict.message)
    except (ConfigError, StateError) as e:
        if not where:
            raise
        raise type(e)(f"{where}: {e}") from None
    p.surgery = surgery_journal_of(state)
    return p


class MixingLoader:
    """A ``Pipeline`` (iterate it, ``checkpoint()``, ``restore()``) whose mixture ``mixing`` steers.

    Each training step: ``record_loss(loss_sum, loss_tokens)`` (this step's figures, reduced over the
    data-parallel groups); when ``due(step)``: ``decide(step, figures)`` with ``local_figures()`` reduced
    over the groups (``LocalFigures.reduced``). Every rank then makes the same decision.
    """

    def __init__(self, pipeline: Pipeline, mixing: Mixing) -> None:
        self.base = pipeline.work_source
        self.names = tuple(s.name for s in getattr(self.base, "sources", ()))
        if not self.names or len(set(self.names)) != len(self.names):
            raise ConfigError("mixing needs a mixture over distinctly named sources (give every source a name)")
        self.pipeline = pipeline
        self.mixing = mixing
        self._counter = mixing.token_counter or counter_of(pipeline)
        self._tokens: Sequence[DocumentTokens] | None = None
        self.journal = MixingJournal((), mixing.weight_by)
        self._iter: Iterator[Batch] | None = None
        self._since_step = 0
        self._reset()

    def _reset(self) -> None:
        self._loss_sum = [0.0] * len(self.names)
        self._loss_tokens = [0] * len(self.names)

    # -- the pipeline's face ----------------------------------------------------------
    def __iter__(self) -> MixingLoader:
        return self

    def __next__(self) -> Batch:
        if self._iter is None:
            self._iter = iter(self.pipeline)
        return next(self._iter)

    def checkpoint(self) -> dict[str, Any]:
        """The pipeline's state: its definition holds the journal, its steering clock where the controller stands
        (collective as ``Pipeline.checkpoint``)."""
        self.pipeline.clock = self.clock()
        return self.pipeline.checkpoint()

    def clock(self) -> Clock:
        """Where the controller stands now: what a resume needs to make the next decision as this run will."""
        return Clock(self._since_step, self.mixing.controller.name, self.mixing.controller.state(),
                     tuple(self._loss_sum), tuple(self._loss_tokens))

    def restore(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state`` on any data-parallel degree: its journal is replayed, not decided again, and the
        controller continues from the state's steering clock (a state written before clocks were kept: from the
        state journaled with the last decision it made, counting the interval from that decision).

        The state names its controller; this run's, built from the recipe, must have that name. A name read from
        a state is compared, never resolved: restoring imports nothing."""
        clock = clock_of(state)
        if clock is not None and clock.controller != self.mixing.controller.name:
            raise ConfigError(f"the checkpoint was steered by controller {clock.controller!r}, this run's [mixing] "
                              f"names {self.mixing.controller.name!r}; {naming(clock.controller)}")
        if clock is not None and len(clock.loss_sum) != len(self.names):
            raise ConfigError(f"the checkpoint's steering clock has {len(clock.loss_sum)} sources' losses, this "
                              f"mixture has {len(self.names)} ({', '.join(self.names)}); use the run's recipe")
        journal = parse_definition(state["definition"]).journal
        if journal is not None and journal.decisions:
            if journal.weight_by != self.mixing.weight_by:
                raise ConfigError(f"mixing.weight_by is {self.mixing.weight_by!r} but the checkpoint's journal weighs "
                                  f"by {journal.weight_by!r}; set weight_by = {journal.weight_by!r}")
            self.pipeline = self.pipeline.with_work_source(self._steered(journal))
            self.journal = journal
        if clock is not None:
            self._since_step = clock.asked_at
            self.mixing.controller.load_state(clock.state)
            self._loss_sum, self._loss_tokens = list(clock.loss_sum), list(clock.loss_tokens)
        elif journal is not None and journal.decisions:  # a state written before clocks were kept
            self._since_step = journal.decisions[-1].step
            mine = [d for d in journal.decisions if d.controller == self.mixing.controller.name]
            if mine:
                self.mixing.controller.load_state(mine[-1].state)
        self.pipeline.restore(state)
        self._iter = None

    def close(self) -> None:
        self.pipeline.close()

    # -- steering ---------------------------------------------------------------------
    def record_loss(self, loss_sum: Sequence[float], loss_tokens: Sequence[int]) -> None:
        """Add one step's per-source loss sums and token counts (reduced over the data-parallel groups)."""
        if len(loss_sum) != len(self.names) or len(loss_tokens) != len(self.names):
            raise ConfigError(f"record_loss: one figure per source ({', '.join(self.names)}), "
                              f"got {len(loss_sum)} and {len(loss_tokens)}")
        for i, (s, n) in enumerate(zip(loss_sum, loss_tokens)):
            self._loss_sum[i] += float(s)
            self._loss_tokens[i] += int(n)

    def due(self, step: int) -> bool:
        """Whether a decision is due after optimizer step ``step`` (counted from 1)."""
        if self.mixing.interval_steps is not None:
            return step - self._since_step >= self.mixing.interval_steps
        assert self.mixing.interval_tokens is not None
        return sum(self._loss_tokens) >= self.mixing.interval_tokens

    def local_figures(self) -> LocalFigures:
        """This pipeline's read frontier and per-source delivered tokens, to reduce over the data-parallel groups."""
        stats = self.pipeline.stats()
        return LocalFigures(self.pipeline.read_frontier(), tuple(s.tokens for s in stats.sources))

    def shares(self) -> tuple[float, ...]:
        """The shares in force after every decision so far (before the first: the recipe's last stage's)."""
        if self.journal.decisions:
            w = self.journal.decisions[-1].weights
            return tuple(w.get(n, 0) / DENOMINATOR for n in self.names)
        return tuple(self.base.stage_shares()[-1][1])

    def decide(self, step: int, figures: LocalFigures | None = None) -> Decision | None:
        """Ask the controller after step ``step``; journal and apply its weights if they change the mixture.

        ``figures``: ``local_figures()`` reduced over every data-parallel group (None: this pipeline's own,
        right only when it is the only group). Returns the decision, or None when the weights stay.
        """
        figures = figures if figures is not None else self.local_figures()
        m, current = self.mixing, self.shares()
        inputs = MixingInputs(step, self.names, tuple(self._loss_sum), tuple(self._loss_tokens),
                              tuple(figures.delivered_tokens), current)
        proposal = m.controller.propose(inputs)
        self._since_step = step
        self._reset()
        if proposal is None:
            return None
        weights = quantize(bounded(current, proposal, m.min_share, m.max_change))
        if weights == quantize(current):
            return None
        decision = Decision(step, self._start_chunk(figures.frontier), dict(zip(self.names, weights)),
                            m.controller.name, m.controller.params(), inputs.digest(), m.controller.state(),
                            inputs.figures())
        journal = self.journal.appended(decision)
        self.pipeline = self.pipeline.switched(self._steered(journal))
        self.journal, self._iter = journal, None
        return decision

    def _steered(self, journal: MixingJournal) -> WorkSource:
        """The recipe's mixture with ``journal`` replayed; token counts are measured once a run."""
        ws = with_journal(self.base, journal, self._counter, self._tokens)
        schedule = getattr(ws, "schedule", None)
        self._tokens = schedule.tokens if schedule is not None else None
        return ws

    def _start_chunk(self, frontier: int) -> int:
        start = frontier + self.mixing.margin_chunks
        if self.journal.decisions:
            return max(start, self.journal.decisions[-1].start_chunk + 1)
        names, starts = self.base.stage_names(), self.base.stage_starts()
        if starts[-1] >= start:
            raise ConfigError(f"mixing: a decision would start at global chunk {start}, before the recipe's stage "
                              f"{names[-1]!r} (chunk {starts[-1]}); steer a recipe whose stages have all started")
        return start
