"""The ledger's cost (ledger.py, this package; issue #35): building a run's ledger from its audit logs and by replay,
writing it as Parquet, a document -> steps lookup. Untargeted: its goals (lookup < 1 s, writing >= 1M rows/s) are
reported, never asserted."""

from __future__ import annotations

from goal import Script, script_goal
from harness import Context


def argv(ctx: Context) -> list[str]:
    return ["--quick"] if ctx.quick else []


SCRIPT = "bench/goals/study_ledger/ledger.py"
GOAL = script_goal("ledger", f"the ledger, untargeted ({SCRIPT}): build rows/s from the audit logs and by replay, "
                   "Parquet write rows/s, document -> steps lookup", Script(SCRIPT, argv))
