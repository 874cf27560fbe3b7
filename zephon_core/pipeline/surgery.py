"""Surgery on a pipeline's lanes: a quarantine journaled by name, resolved to each lane's documents to leave out."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from zephon_core.batch import Cursor
from zephon_core.checkpoint.state import make_state, parse_lanes
from zephon_core.checkpoint.surgery import Journal, Quarantine
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.errors import ConfigError
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


def lane_quarantines(journal: Journal, work_source: WorkSource, lanes: Sequence[int]) -> dict[int, LaneQuarantine]:
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
    lanes = parse_lanes(state)
    return make_state(state["definition"], state["canonical_replicas"], state["topology"], lanes, pipeline.surgery)
