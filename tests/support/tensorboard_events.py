"""Read back what a run wrote to TensorBoard (the e2e and loader-level tests of Zephon's metrics)."""

from __future__ import annotations

from pathlib import Path


def scalars(folder: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value of every scalar in the event files anywhere under ``folder``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for events in sorted({f.parent for f in Path(folder).rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return out
