"""What an adapter logs every logging interval: ``Pipeline.stats()`` turned into ``zephon/...``
scalars for the framework's metric writers and one console line (``IntervalMetrics``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from zephon_core.metrics import COUNTER_NAMES, COUNTERS
from zephon_core.pipeline.stats import PipelineStats


@dataclass(frozen=True)
class LoggedFigures:
    """One logging interval's figures: ``scalars`` for the framework's metric writers, ``line`` for its console."""

    scalars: dict[str, float]
    line: str


class IntervalMetrics:
    """What an adapter logs for Zephon every logging interval, from ``Pipeline.stats()`` snapshots.

    ``take(stats)`` returns, under ``prefix``:

    * the snapshot's own scalars (``PipelineStats.scalars``: per source tokens, documents and
      epochs, the ``run/...`` figures, stage, batches, padding and truncation fractions), which
      are cumulative, as a dashboard plots them;
    * in place of the process-wide execution counters, which only ever grow, what they grew by
      since the previous ``take`` (the first one: since this object was made):
      ``interval/<counter>`` for every ``zephon_core.metrics.COUNTER_NAMES`` entry and for the
      pipeline's ``wait_s``, plus ``interval/seconds`` (wall time of the interval) and ``interval/wait_fraction`` (the
      share of it the training loop spent waiting for batches).

    One object per logging rank; making it reads the counters, never the pipeline.
    """

    def __init__(self, prefix: str = "zephon/", clock: Callable[[], float] = time.perf_counter) -> None:
        self.prefix = prefix
        self._clock = clock
        self._since = clock()
        self._counters = COUNTERS.snapshot()
        self._waited = 0.0  # the pipeline's wait_s at the previous take

    def take(self, stats: PipelineStats) -> LoggedFigures:
        """The figures of the interval that ends now."""
        now = self._clock()
        seconds = max(now - self._since, 0.0)
        grew = {name: float(stats.counters[name]) - self._counters.get(name, 0.0) for name in COUNTER_NAMES}
        self._since, self._counters = now, {name: float(stats.counters[name]) for name in COUNTER_NAMES}
        p = self.prefix
        cumulative = {*COUNTER_NAMES, "wait_s"}
        scalars = {name: value for name, value in stats.scalars(p).items() if name[len(p):] not in cumulative}
        scalars.update({f"{p}interval/{name}": value for name, value in grew.items()})
        waited = stats.wait_s - self._waited
        self._waited = stats.wait_s
        scalars[f"{p}interval/wait_s"] = waited
        scalars[f"{p}interval/seconds"] = seconds
        scalars[f"{p}interval/wait_fraction"] = waited / seconds if seconds > 0 else 0.0
        return LoggedFigures(scalars, console_line(stats, waited, seconds))


def console_line(stats: PipelineStats, waited_s: float, seconds: float) -> str:
    """One line for a training log: stage, waiting, tokens per source (and their run share), padding."""
    waited = f"waited {waited_s:.3f} s of {seconds:.2f} s"
    if seconds > 0:
        waited += f" ({100 * waited_s / seconds:.1f}%)"
    tokens = " ".join(f"{s.name}={s.tokens:,}" for s in stats.sources)
    parts = [f"zephon: stage {stats.stage} ({stats.stage_name})", waited, f"tokens {tokens}"]
    if any(s.run_share is not None for s in stats.sources):
        parts.append("run share " + " ".join(f"{s.name}={s.run_share or 0.0:.3f}" for s in stats.sources))
    parts.append(f"padding {100 * stats.padding_fraction:.2f}%")
    return " | ".join(parts)
