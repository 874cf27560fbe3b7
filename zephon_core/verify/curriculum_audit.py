"""Offline checks of a curriculum and of what a run's lanes read from it (``zephon verify-elastic``, ``trace``).

``audit_curriculum`` walks global chunks ``0 .. upto-1`` and counts, per
source, how often each document has been used. A source whose stream has
advanced ``P`` positions over ``n`` documents has, if no document was
repeated within an epoch and none skipped, used every document ``P // n`` or
``P // n + 1`` times, exactly ``P % n`` of them the higher count. That is
checked at every chunk boundary — so across every stage change — from the
chunks alone, not from the curriculum's own bookkeeping. ``chunks_read``
gives ``upto`` for a checkpoint state: one past the last chunk its lanes read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon_core.checkpoint.state import parse_lanes
from zephon_core.curriculum.work_source import WorkSource

_BATCH = 256


@dataclass
class Audit:
    """What ``audit_curriculum`` found over chunks ``0 .. chunks - 1``."""

    chunks: int
    used: list[int]  # per source: stream positions used (documents, counting repeats across epochs)
    problems: list[str] = field(default_factory=list)

    def summary(self, work_source: WorkSource) -> str:
        parts = [f"{s.name} {u} documents ({u / len(s):.3g} epochs)" for s, u in zip(work_source.sources, self.used)]
        verdict = "no document repeated within a source epoch, none skipped" if not self.problems else f"{len(self.problems)} problem(s)"
        return f"curriculum audit of global chunks 0..{self.chunks - 1}: {verdict}; used {', '.join(parts)}"


def audit_curriculum(work_source: WorkSource, upto: int, max_problems: int = 5) -> Audit:
    """Check global chunks ``0 .. upto-1`` of ``work_source`` (fewer if a finite curriculum ends first)."""
    sizes = [len(s) for s in work_source.sources]
    counts = [np.zeros(n, dtype=np.int64) for n in sizes]
    problems: list[str] = []
    done = 0
    for a in range(0, upto, _BATCH):
        batch = work_source.chunks(list(range(a, min(upto, a + _BATCH))))
        for chunk in batch:
            if chunk is None:
                return Audit(done, [int(c.sum()) for c in counts], problems)
            for s, c in enumerate(counts):
                np.add.at(c, chunk.documents[chunk.sources == s], 1)
                used = int(c.sum())
                k, extra = divmod(used, sizes[s])
                low, high = int(c.min()), int(c.max())
                if (low < k or high > k + 1 or int((c == k + 1).sum()) != extra) and len(problems) < max_problems:
                    name = work_source.sources[s].name
                    worst = int(np.argmax(c)) if high > k + 1 else int(np.argmin(c))
                    problems.append(f"after global chunk {chunk.index}: source {name!r} document {worst} used {int(c[worst])} times "
                                    f"after {used} documents ({k} whole epoch(s) + {extra}): repeated within an epoch or skipped")
            done += 1
    return Audit(done, [int(c.sum()) for c in counts], problems)


def chunks_read(state: Mapping[str, Any]) -> int:
    """One past the last global chunk any lane of ``state`` has started (its cursor's chunk, read or partly read)."""
    C = int(state["canonical_replicas"])
    lanes = parse_lanes(state)
    return max((lane + ls.cursor.chunk * C + 1 for lane, ls in lanes.items()), default=0)


def stage_name(work_source: WorkSource, g: int) -> str | None:
    """The name of the stage global chunk ``g`` belongs to (None for a work source without stages)."""
    if getattr(work_source, "schedule", None) is None:
        return None
    return work_source.stage_names()[work_source.stage_of(g)]
