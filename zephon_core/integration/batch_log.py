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
is taken; ``read_batch_log`` reads a log back.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple, TextIO

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


class Audited(Iterator[Batch]):
    """``batches`` as they are taken, each written to the batch log first (when one is open);
    ``close()`` closes the log. ``iter(batches)`` is called at the first batch, not before."""

    def __init__(self, batches: Iterable[Batch], log: TextIO | None) -> None:
        self._batches = batches
        self._it: Iterator[Batch] | None = None
        self.log = log

    def __next__(self) -> Batch:
        if self._it is None:
            self._it = iter(self._batches)
        batch = next(self._it)
        if self.log is not None:
            self.log.write(log_line(batch))
        return batch

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None


def audited(batches: Iterable[Batch], rank: int) -> Audited:
    """``batches``, each logged to ``ZEPHON_BATCH_LOG`` for ``rank`` (opened now) as it is taken;
    unchanged when it is unset."""
    return Audited(batches, open_batch_log(rank))


class LoggedBatch(NamedTuple):
    """One line of a batch audit log; ``stage`` is -1 and the counts empty in a line of the first format."""

    lane: int
    lane_index: int
    digest: str
    stage: int
    tokens: dict[int, int]
    documents: dict[int, int]


def _pairs(counts: np.ndarray) -> str:
    nz = np.flatnonzero(counts)
    return ",".join(f"{s}:{int(counts[s])}" for s in nz.tolist()) or "-"


def log_line(batch: Batch) -> str:
    """The audit line of one delivered batch."""
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
