"""The batch audit log: one line per batch a rank trains on, for comparing runs and drawing them.

``ZEPHON_BATCH_LOG=/path/batches-{rank}.log`` (``{rank}`` is replaced by the
caller's rank) makes the framework adapters append, for every delivered batch::

    lane lane_index digest stage tokens documents

``stage`` is the curriculum stage the batch counts in; ``tokens`` and
``documents`` are ``source:count`` pairs joined by commas (``-`` for none):
tokens of each source in the batch's rows, and documents whose first token is
in them. The global step of a batch is
``lane_index // (batches_per_step / canonical_replicas)`` on every topology,
so logs of runs on different numbers of ranks compare step by step.
Lines of the first format (``lane lane_index digest``) are still read.

An adapter wraps the batches it trains on in ``audited(batches, rank)``, which logs each one as it
is taken, and is the one writer of the log: items that are not batches themselves (a live step's
``(batch, weight)`` pairs, a micro-batch received from a peer) name their batch through ``batch_of``,
and a trainer that cuts its batches step by step feeds each step's to the same log (``Audited.over``).
A peer that received only a batch's identity (a ``LoggedBatch`` without counts) writes a line of the
first format. ``read_batch_log`` reads a log back.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Generic, NamedTuple, TextIO, TypeVar

import numpy as np

from zephon_core.batch import Batch
from zephon_core.errors import DataError

ENV = "ZEPHON_BATCH_LOG"


def open_batch_log(rank: int) -> TextIO | None:
    """The log named by ``ZEPHON_BATCH_LOG`` for ``rank``, or None when it is unset."""
    pattern = os.environ.get(ENV)
    if not pattern:
        return None
    path = pattern.replace("{rank}", str(rank))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return open(path, "a", encoding="utf-8", buffering=1)


T = TypeVar("T")


class Audited(Iterator[T], Generic[T]):
    """``items`` as they are taken, the batch of each (``batch_of``; None: a pad, not logged) written to the
    batch log first (when one is open); ``close()`` closes the log. ``iter(items)`` is called at the first
    item, not before."""

    def __init__(self, items: Iterable[T], log: TextIO | None,
                 batch_of: Callable[[T], Batch | LoggedBatch | None] | None = None) -> None:
        self._items = items
        self._it: Iterator[T] | None = None
        self._batch_of = batch_of
        self.log = log

    def __next__(self) -> T:
        if self._it is None:
            self._it = iter(self._items)
        item = next(self._it)
        if self.log is not None:
            batch: Any = item if self._batch_of is None else self._batch_of(item)
            if batch is not None:
                self.log.write(log_line(batch))
        return item

    def over(self, items: Iterable[T]) -> Audited[T]:
        """``items`` next, into the same log (a trainer that cuts each step's batches opens the log once)."""
        self._items, self._it = items, None
        return self

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None


def audited(items: Iterable[T], rank: int, *,
            batch_of: Callable[[T], Batch | LoggedBatch | None] | None = None) -> Audited[T]:
    """``items`` (batches, or anything ``batch_of`` finds a batch or a ``LoggedBatch`` in), each logged to
    ``ZEPHON_BATCH_LOG`` for ``rank`` (opened now) as it is taken; unchanged when it is unset."""
    return Audited(items, open_batch_log(rank), batch_of)


class LoggedBatch(NamedTuple):
    """One line of a batch audit log; ``stage`` is -1 and the counts empty in a line of the first format."""

    lane: int
    lane_index: int
    digest: str
    stage: int
    tokens: dict[int, int]
    documents: dict[int, int]

    @classmethod
    def identity(cls, lane: int, lane_index: int, digest: str) -> LoggedBatch:
        """A batch known by its identity alone (its stage and counts unknown): a line of the first format."""
        return cls(lane, lane_index, digest, -1, {}, {})


def _pairs(counts: np.ndarray) -> str:
    nz = np.flatnonzero(counts)
    return ",".join(f"{s}:{int(counts[s])}" for s in nz.tolist()) or "-"


def log_line(batch: Batch | LoggedBatch) -> str:
    """The audit line of one delivered batch; of a ``LoggedBatch`` without a stage (a batch's identity alone,
    as a peer receives it), a line of the first format."""
    if isinstance(batch, LoggedBatch):
        if batch.stage < 0:
            return f"{batch.lane} {batch.lane_index} {batch.digest}\n"
        logged = [",".join(f"{s}:{n}" for s, n in counts.items()) or "-" for counts in (batch.tokens, batch.documents)]
        return f"{batch.lane} {batch.lane_index} {batch.digest} {batch.stage} {logged[0]} {logged[1]}\n"
    seg = batch.segments
    tokens = np.bincount(seg[:, 1], weights=seg[:, 4] - seg[:, 3]) if len(seg) else np.zeros(0)
    documents = np.bincount(seg[seg[:, 3] == 0, 1]) if len(seg) else np.zeros(0)
    return f"{batch.lane} {batch.lane_index} {batch.digest} {batch.stage} {_pairs(tokens)} {_pairs(documents)}\n"


def _parse_pairs(text: str) -> dict[int, int]:
    if text == "-":
        return {}
    return {int(s): int(n) for s, n in (pair.split(":") for pair in text.split(","))}


def parse_line(line: str, where: str = "batch log") -> LoggedBatch:
    """One audit line (either format); a malformed line is a ``DataError`` naming ``where``."""
    fields = line.split()
    try:
        if len(fields) == 3:
            return LoggedBatch(int(fields[0]), int(fields[1]), fields[2], -1, {}, {})
        if len(fields) == 6:
            return LoggedBatch(int(fields[0]), int(fields[1]), fields[2], int(fields[3]), _parse_pairs(fields[4]),
                               _parse_pairs(fields[5]))
    except ValueError:
        pass
    raise DataError(f"{where}: not a batch audit line (want 'lane lane_index digest stage tokens documents'): "
                    f"{line.strip()[:80]!r}")


def read_batch_log(path: str | os.PathLike[str]) -> Iterator[LoggedBatch]:
    """The batches of one audit log file, in the order the rank trained on them."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                yield parse_line(line, f"{Path(path).name} line {n}")
