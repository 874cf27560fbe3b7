"""The batch audit log: one line per batch a rank trains on, for comparing runs.

``ZEPHON_BATCH_LOG=/path/batches-{rank}.log`` (``{rank}`` is replaced by the
caller's rank) makes the framework adapters append ``lane lane_index digest``
for every delivered batch. The global step of a batch is
``lane_index // (batches_per_step / canonical_replicas)`` on every topology,
so logs of runs on different numbers of ranks compare step by step.
"""

from __future__ import annotations

import os
from typing import TextIO

from zephon_core.batch import Batch

ENV = "ZEPHON_BATCH_LOG"


def open_batch_log(rank: int) -> TextIO | None:
    """The log named by ``ZEPHON_BATCH_LOG`` for ``rank``, or None when it is unset."""
    pattern = os.environ.get(ENV)
    if not pattern:
        return None
    path = pattern.replace("{rank}", str(rank))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return open(path, "a", encoding="utf-8", buffering=1)


def log_line(batch: Batch) -> str:
    return f"{batch.lane} {batch.lane_index} {batch.digest}\n"
