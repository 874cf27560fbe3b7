"""Runtime counters: the one seam every stage records into, and a lane's tally of what it delivered.

Two kinds of figures, kept apart on purpose:

* ``COUNTERS`` are process-wide execution figures (seconds spent reading, tokenizing,
  packing; object-store requests, bytes, retries; cache hits). The seconds a consumer
  waited in ``next()`` are each pipeline's own (``PipelineStats.wait_s``). Stages add to
  them through ``COUNTERS.add`` / ``COUNTERS.timed``; nothing reads them back on the data
  path, so they can never change the data. They are per process, not per pipeline: a
  training process runs one pipeline (a second one, for validation, adds to the same).
* A ``Tally`` is what one lane has delivered, per stage and source (tokens, documents,
  rows, padding, documents cut at a row boundary). It is computed from the delivered
  batches' segments alone (no data is re-read), travels with the lane in the checkpoint
  state, and so sums over the lanes of a merged state to the figures of the whole run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

# Every name COUNTERS keeps, with its meaning (docs/watching.md lists the same names).
COUNTER_NAMES: dict[str, str] = {
    "read_s": "seconds spent reading documents from sources (all threads)",
    "tokenize_s": "seconds spent in per-document operators: tokenize, map, filter (all threads)",
    "pack_s": "seconds spent packing documents into rows (all threads)",
    "store_requests": "object-store range requests made (each attempt counts)",
    "store_bytes": "bytes received from the object store",
    "store_retries": "object-store requests that failed and were tried again",
    "page_hits": "object-store pages served from the process's page pool",
    "page_misses": "object-store pages that had to be fetched",
    "shard_cache_hits": "whole-shard cache entries found on local disk",
    "shard_cache_misses": "whole-shard cache entries that had to be made",
}


class Counters:
    """Process-wide execution counters (``COUNTER_NAMES``), safe to add to from any thread."""

    def __init__(self) -> None:
        self._values = dict.fromkeys(COUNTER_NAMES, 0.0)
        self._lock = threading.Lock()

    def add(self, name: str, amount: float = 1.0) -> None:
        with self._lock:
            self._values[name] += amount

    def timed(self, name: str) -> _Timed:
        """A ``with`` block whose seconds are added to ``name``."""
        return _Timed(self, name)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self._values)


class _Timed:
    """``Counters.timed``: a plain class, not a generator-based context manager, which costs several times more."""

    __slots__ = ("_counters", "_name", "_t0")

    def __init__(self, counters: Counters, name: str) -> None:
        self._counters, self._name = counters, name

    def __enter__(self) -> None:
        self._t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._counters.add(self._name, time.perf_counter() - self._t0)


COUNTERS = Counters()


@dataclass
class Tally:
    """What one lane delivered, counted from the segments of its delivered batches.

    ``tokens[i][s]`` / ``documents[i][s]``: tokens and documents of source ``s``
    delivered while the lane stood in stage ``i`` (a document counts once, in the
    row that holds its first token). ``rows`` packed rows of ``width`` tokens hold
    ``padding`` pad tokens; ``cut`` counts the row stretches that continue a document
    from an earlier row (its later tokens cannot attend to the earlier ones).
    ``truncated`` counts the tokens dropped from documents cut to one row
    (``pack(overlong="truncate")``): each such document leaves an empty marker segment
    ``(row, source, document, L, L)`` right after the stretch kept, ``L`` its length.
    ``since`` is the lane's delivered-batch count when counting began: 0 for a
    lane counted from the start of the run, more for a lane restored from a state
    written before states carried tallies.
    """

    since: int = 0
    rows: int = 0
    padding: int = 0
    cut: int = 0
    tokens: list[list[int]] = field(default_factory=list)
    documents: list[list[int]] = field(default_factory=list)
    truncated: int = 0

    def _fit(self, n_stages: int, n_sources: int) -> None:
        """Grow the tables to at least ``n_stages`` x ``n_sources`` (stages and sources can be appended to a run)."""
        while len(self.tokens) < n_stages:
            self.tokens.append([])
            self.documents.append([])
        for table in (self.tokens, self.documents):
            for row in table:
                if len(row) < n_sources:
                    row.extend([0] * (n_sources - len(row)))

    def add_segments(self, segments: Sequence[np.ndarray], stage: int, n_sources: int) -> None:
        """Count the segments of delivered batches of one stage, all in one pass (a NumPy call per batch would cost
        more than a fast batch). Their rows were counted already (``rows``, and ``padding`` as the rows' full width):
        this takes the tokens the segments fill off ``padding``."""
        if not segments:
            return
        seg = np.concatenate(segments) if len(segments) > 1 else segments[0]
        start = seg[:, 3]
        firsts = start == 0
        n_first = int(np.count_nonzero(firsts))
        filled = int(seg[:, 4].sum()) - int(start.sum())
        self._fit(stage + 1, n_sources)
        tokens, documents = self.tokens[stage], self.documents[stage]
        if n_sources == 1:  # the common pretokenized case: no per-source split to make
            tokens[0] += filled
            documents[0] += n_first
        else:
            src = seg[:, 1]
            tok = np.bincount(src, weights=seg[:, 4] - start, minlength=n_sources)
            doc = np.bincount(src[firsts], minlength=n_sources)
            for s in np.flatnonzero(tok + doc).tolist():
                tokens[s] += int(tok[s])
                documents[s] += int(doc[s])
        self.padding -= filled
        marks = np.flatnonzero((seg[:, 4] == start) & (start > 0))  # truncation markers (no other segment is empty)
        if len(marks):
            self.truncated += int(seg[marks, 3].sum()) - int(seg[marks - 1, 4].sum())
        self.cut += len(seg) - n_first - len(marks)

    def add(self, other: Tally) -> None:
        """Add another lane's figures (``since`` becomes the larger: counting is complete only from 0)."""
        self._fit(len(other.tokens), max((len(r) for r in other.tokens), default=0))
        self.since = max(self.since, other.since)
        self.rows += other.rows
        self.padding += other.padding
        self.cut += other.cut
        self.truncated += other.truncated
        for table, theirs in ((self.tokens, other.tokens), (self.documents, other.documents)):
            for mine, row in zip(table, theirs):
                for s, v in enumerate(row):
                    mine[s] += v

    def total_tokens(self) -> int:
        return sum(map(sum, self.tokens))

    def to_json(self) -> dict[str, object]:
        """``truncated`` only when not 0: states of runs that truncate nothing stay as they were."""
        out: dict[str, object] = {"since": self.since, "rows": self.rows, "padding": self.padding, "cut": self.cut,
                                  "tokens": [list(r) for r in self.tokens], "documents": [list(r) for r in self.documents]}
        if self.truncated:
            out["truncated"] = self.truncated
        return out

    def copy(self) -> Tally:
        return Tally(self.since, self.rows, self.padding, self.cut, [list(r) for r in self.tokens],
                     [list(r) for r in self.documents], self.truncated)


def sum_tallies(tallies: Iterable[Tally | None], n_stages: int = 0, n_sources: int = 0) -> Tally:
    """The figures of several lanes together, as tables of at least ``n_stages`` x ``n_sources``."""
    out = Tally()
    out._fit(n_stages, n_sources)
    for t in tallies:
        if t is not None:
            out.add(t)
    out._fit(n_stages, max((len(r) for r in out.tokens), default=n_sources))
    return out
