"""The registry: every goal the bench measures, in the order it runs them and results.md shows them.

A goal is one package here, bench/goals/<goal>/: its ``__init__.py`` declares ``GOAL = Goal(...)`` (see
bench/goal.py); beside it, the scripts and cases only that goal runs and, where it draws one, ``plot.py`` (its
figure for docs/img, drawn by bench/plot.py). Adding a goal is one package and one line in ``REGISTRY``.
"""

from __future__ import annotations

from goal import Goal

from goals import (
    p1_throughput,
    p2_pretokenized,
    p3_restore,
    p4_aggregation,
    p4s_scale,
    p5_state,
    p6_memory,
    p7_startup,
    p8_object_store,
    p9_watching,
    p10_formats,
    p11_live,
    p12_mixing,
    profiles,
    study_curriculum,
    study_ledger,
    study_packing,
)

REGISTRY: list[Goal] = [
    p1_throughput.GOAL,
    p2_pretokenized.GOAL,
    p3_restore.GOAL,
    p4_aggregation.GOAL,
    p4s_scale.GOAL,
    p5_state.GOAL,
    p6_memory.GOAL,
    p7_startup.GOAL,
    p8_object_store.GOAL,
    p9_watching.GOAL,
    p10_formats.GOAL,
    p11_live.GOAL,
    p12_mixing.GOAL,
    study_curriculum.GOAL,
    study_packing.GOAL,
    study_ledger.GOAL,
    profiles.GOAL,
]


def targets() -> dict[str, float]:
    """Every goal's targets (results.json's ``goals_targets``)."""
    return {k: v for g in REGISTRY for k, v in g.targets.items()}
