"""The batch audit log: one line per batch a rank trains on, for comparing runs and drawing them.

``ZEPHON_BATCH_LOG=/path/batches-{rank}.log`` (``{rank}`` is replaced by the
caller's rank) makes the framework adapters append, for every delivered batch::

    lane lane_index digest stage tokens documents rows

``stage`` is the curriculum stage the batch counts in; ``tokens`` and
``documents`` are ``source:count`` pairs joined by commas (``-`` for none):
tokens of each source in the batch's rows, and documents whose first token is
in them. ``rows`` says which documents the batch held (its ``Batch.segments``):
the rows joined by ``/`` (row 0 first), each row's stretches joined by ``,``, a
stretch being ``source.document.start.stop`` (the document's tokens
``[start, stop)`` in that row; ``-`` for a batch without any), so
``0.12.0.41,1.7.0.88/1.7.88.217`` is row 0 holding document 12 of source 0 and
the first 88 tokens of document 7 of source 1, row 1 the next 129 of it; the
ledger (``verify.ledger_logs``) is built from these without reading the corpus.
The global step of a batch is
``lane_index // (batches_per_step / canonical_replicas)`` on every topology,
so logs of runs on different numbers of ranks compare step by step.
Lines of the earlier formats (``lane lane_index digest``, and the six fields
before ``rows``) are still read; their ``rows`` is empty.

An adapter wraps the batches it trains on in ``audited(batches, rank)``, which logs each one as it
is taken, and is the one writer of the log: items that are not batches themselves (a live step's
``(batch, weight)`` pairs, a micro-batch received from a peer) name their batch through ``batch_of``,
and a trainer that cuts its batches step by step feeds each step's to the same log (``Audited.over``).
A peer that received only a batch's identity (a ``LoggedBatch`` without counts) writes a line of the
first format. ``read_batch_log`` reads a log back.
"""

from __future__ import annotations

import os
import re
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
    """One line of a batch audit log; ``stage`` is -1 and the counts empty in a line of the first format, ``rows``
    empty in a line of the first two (kept as the line's text: most readers never decode it)."""

    lane: int
    lane_index: int
    digest: str
    stage: int
    tokens: dict[int, int]
    documents: dict[int, int]
    rows: str = ""

    def stretches(self) -> np.ndarray:
        """The batch's ``(row, source, document, start, stop)`` stretches, as ``Batch.segments`` held them (none
        for a line that does not say)."""
        return decode_rows([self.rows], [""]).reshape(-1, 5)

    @classmethod
    def identity(cls, lane: int, lane_index: int, digest: str) -> LoggedBatch:
        """A batch known by its identity alone (its stage and counts unknown): a line of the first format."""
        return cls(lane, lane_index, digest, -1, {}, {})


def _pairs(counts: np.ndarray) -> str:
    nz = np.flatnonzero(counts)
    return ",".join(f"{s}:{int(counts[s])}" for s in nz.tolist()) or "-"


def encode_rows(segments: np.ndarray) -> str:
    """The ``rows`` field of a batch's segments (the module docstring says the form)."""
    if not len(segments):
        return "-"
    rows: list[list[str]] = [[] for _ in range(int(segments[:, 0].max()) + 1)]
    for r, s, d, a, b in segments.tolist():
        rows[r].append(f"{s}.{d}.{a}.{b}")
    return "/".join(",".join(row) for row in rows)


_STRETCHES = r"(?:\d+\.\d+\.\d+\.\d+(?:,\d+\.\d+\.\d+\.\d+)*)?"
_ROWS = re.compile(rf"-|{_STRETCHES}(?:/{_STRETCHES})*")


def decode_rows(rows: Iterable[str], heads: Iterable[str]) -> np.ndarray:
    """The stretches of many ``rows`` fields as one flat int64 array, each stretch
    ``head... row source document start stop`` (``head``: that field's leading numbers, each followed by a space,
    e.g. its step and lane). One text parse for all of them: the ledger reads a run's logs at this speed."""
    parts = []
    for text, head in zip(rows, heads):
        if text and text != "-":
            for r, row in enumerate(text.split("/")):
                if row:
                    parts.append(f"{head}{r} " + row.replace(",", f" {head}{r} "))
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.fromstring(" ".join(parts).replace(".", " "), dtype=np.int64, sep=" ")


def log_line(batch: Batch | LoggedBatch) -> str:
    """The audit line of one delivered batch; of a ``LoggedBatch`` without a stage (a batch's identity alone,
    as a peer receives it), a line of the first format."""
    if isinstance(batch, LoggedBatch):
        if batch.stage < 0:
            return f"{batch.lane} {batch.lane_index} {batch.digest}\n"
        logged = [",".join(f"{s}:{n}" for s, n in counts.items()) or "-" for counts in (batch.tokens, batch.documents)]
        rows = f" {batch.rows}" if batch.rows else ""
        return f"{batch.lane} {batch.lane_index} {batch.digest} {batch.stage} {logged[0]} {logged[1]}{rows}\n"
    seg = batch.segments
    tokens = np.bincount(seg[:, 1], weights=seg[:, 4] - seg[:, 3]) if len(seg) else np.zeros(0)
    documents = np.bincount(seg[seg[:, 3] == 0, 1]) if len(seg) else np.zeros(0)
    return (f"{batch.lane} {batch.lane_index} {batch.digest} {batch.stage} {_pairs(tokens)} {_pairs(documents)} "
            f"{encode_rows(seg)}\n")


def _parse_pairs(text: str) -> dict[int, int]:
    if text == "-":
        return {}
    return {int(s): int(n) for s, n in (pair.split(":") for pair in text.split(","))}


def _parsed(line: str) -> LoggedBatch | None:
    fields = line.split()
    try:
        if len(fields) == 3:
            return LoggedBatch(int(fields[0]), int(fields[1]), fields[2], -1, {}, {})
        if len(fields) in (6, 7) and (len(fields) == 6 or _ROWS.fullmatch(fields[6])):
            return LoggedBatch(int(fields[0]), int(fields[1]), fields[2], int(fields[3]), _parse_pairs(fields[4]),
                               _parse_pairs(fields[5]), fields[6] if len(fields) == 7 else "")
    except ValueError:
        pass
    return None


def parse_line(line: str, where: str = "batch log") -> LoggedBatch:
    """One audit line (any format); a malformed line is a ``DataError`` naming ``where``."""
    batch = _parsed(line)
    if batch is None:
        raise DataError(f"{where}: not a batch audit line (want 'lane lane_index digest stage tokens documents rows'): "
                        f"{line.strip()[:80]!r}")
    return batch


def read_batch_log(path: str | os.PathLike[str]) -> Iterator[LoggedBatch]:
    """The batches of one audit log file, in the order the rank trained on them."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                batch = _parsed(line)
                yield batch if batch is not None else parse_line(line, f"{Path(path).name} line {n}")
