"""Surgery on a pipeline's lanes: a quarantine journaled by name, resolved to each lane's documents to leave out;
what a recipe's ``[surgery]`` table asks, applied once to a restored pipeline (``apply_surgery``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zephon_core.batch import Cursor
from zephon_core.checkpoint.state import with_surgery
from zephon_core.checkpoint.surgery import Quarantine, SurgeryJournal
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.errors import ConfigError, StateError
from zephon_core.lane.chunks import LaneQuarantine
from zephon_core.pipeline.engine import OperatorChain
from zephon_core.pipeline.resume import last_read_chunk


def first_unread_chunk(lane: int, cursor: Cursor, C: int, work_source: WorkSource,
                       chain: Callable[[], OperatorChain]) -> int:
    """The first lane chunk lane ``lane`` at ``cursor`` has not begun to read (a partly delivered shuffle or fit
    window counts as read to its end, since a restore refills it)."""
    g = last_read_chunk(lane, cursor, C, work_source, chain)
    return 0 if g < 0 else (g - lane) // C + 1


def quarantine_of(documents: Sequence[tuple[str, int]], work_source: WorkSource, starts: Sequence[int]) -> Quarantine:
    """A quarantine of ``documents`` (source name, number) from lane chunks ``starts``; a source or a document the
    work source does not have is refused naming it."""
    names = [s.name for s in work_source.sources]
    if not documents:
        raise ConfigError("a quarantine needs at least one document (SOURCE#N)")
    for name, number in documents:
        if name not in names:
            raise ConfigError(f"quarantine {name}#{number}: no source {name!r} (sources: {', '.join(names)})")
        size = len(work_source.sources[names.index(name)])
        if not 0 <= number < size:
            raise ConfigError(f"quarantine {name}#{number}: source {name!r} has documents 0..{size - 1}")
    return Quarantine(tuple(sorted(set(documents))), tuple(starts))


def lane_quarantines(journal: SurgeryJournal, work_source: WorkSource,
                     lanes: Sequence[int]) -> dict[int, LaneQuarantine]:
    """Each of ``lanes``' documents to leave out, from the journal's quarantines (none: an empty dict)."""
    if not journal.quarantines:
        return {}
    names = [s.name for s in work_source.sources]
    out = {}
    for lane in lanes:
        parts = [(q.from_chunks[lane] if lane < len(q.from_chunks) else 0,
                  [(names.index(s), d) for s, d in q.documents if s in names]) for q in journal.quarantines]
        out[lane] = LaneQuarantine(parts)
    return out


def quarantined_state(pipeline: Any, state: Mapping[str, Any], documents: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """``state`` with ``documents`` journaled as quarantined from each lane's first unread chunk; ``pipeline`` is the
    run's (any group: it is restored from the state and not iterated)."""
    pipeline.restore(state)
    pipeline.quarantine(documents)
    return with_surgery(state, pipeline.surgery)


def steps_of(text: str, where: str) -> tuple[int, int]:
    """``A..B`` (or one step ``A``) as ``(A, B)``; anything else is a ConfigError naming ``where``."""
    first, sep, last = text.partition("..")
    try:
        a, b = int(first), int(last if sep else first)
    except ValueError:
        raise ConfigError(f"{where} {text!r}: give global steps as A..B (from 1, inclusive), e.g. 1200..1450") from None
    if not 1 <= a <= b:
        raise ConfigError(f"{where} {text!r}: a skip needs steps A..B with 1 <= A <= B")
    return a, b


def document_of(text: str, where: str,
                or_else: str = "zephon ledger ... --document HASH names a hash's documents") -> tuple[str, int]:
    """``SOURCE#N`` as ``(source, N)``; anything else is a ConfigError naming ``where`` and ending with ``or_else``."""
    source, sep, number = text.rpartition("#")
    if not sep or not source or not number.isdigit():
        raise ConfigError(f"{where} {text!r}: name a document as SOURCE#N (a source's name, a document number), "
                          f"as zephon ledger prints it; {or_else}")
    return source, int(number)


@dataclass(frozen=True)
class SurgeryRequest:
    """Surgery a run is asked for at start-up (a recipe's ``[surgery]``, Megatron's ``--iterations-to-skip``):
    global step ranges to skip and documents to quarantine; ``where`` names its origin in messages."""

    skips: tuple[tuple[int, int], ...] = ()
    documents: tuple[tuple[str, int], ...] = ()
    where: str = "surgery"

    @classmethod
    def parse(cls, skip_steps: Sequence[str], quarantine: Sequence[str], where: str) -> SurgeryRequest:
        """From the recipe's text forms, each refused naming ``where`` and its index."""
        return cls(tuple(steps_of(t, f"{where}.skip_steps[{n}]") for n, t in enumerate(skip_steps)),
                   tuple(document_of(t, f"{where}.quarantine[{n}]") for n, t in enumerate(quarantine)), where)

    def __bool__(self) -> bool:
        return bool(self.skips or self.documents)


def apply_surgery(pipeline: Any, request: SurgeryRequest, batches_per_step: int) -> list[str]:
    """Journal in ``pipeline`` (restored, not yet iterated) what ``request`` asks and its journal lacks; what is
    journaled already (a resume after the surgery) is left as it is, so a request may stay in a recipe for the rest
    of the run. Returns a line per entry journaled now. A skip ``Pipeline.skip_steps`` refuses
    (``checkpoint.surgery.add_skips``), or a document the sources do not have, is refused naming ``request.where``."""
    done: list[str] = []
    for first, last in request.skips:
        before = pipeline.surgery
        try:
            pipeline.skip_steps(first, last, batches_per_step)
        except StateError as e:
            raise StateError(f"{request.where}: {e}") from None
        if pipeline.surgery != before:
            done.append(f"steps {first}..{last} skipped ({batches_per_step} batches a step)")
    journaled = {d for q in pipeline.surgery.quarantines for d in q.documents}
    new = [d for d in dict.fromkeys(request.documents) if d not in journaled]
    if new:
        try:
            pipeline.quarantine(new)
        except ConfigError as e:
            raise ConfigError(f"{request.where}: {e}") from None
        done.append(f"quarantined {pipeline.surgery.quarantines[-1]} from each lane's first unread chunk")
    return done
