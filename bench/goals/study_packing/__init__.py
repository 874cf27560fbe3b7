"""The packing study (packing.py, this package): padding, documents cut and tokens/s of each packing mode.
Untargeted (its goals are reported, never asserted): results.md shows what it measured; docs/performance.md reads it."""

from __future__ import annotations

from goal import Script, script_goal
from harness import Context


def argv(ctx: Context) -> list[str]:
    return ["--work", str(ctx.work), *(["--docs", "2000"] if ctx.quick else [])]


SCRIPT = "bench/goals/study_packing/packing.py"
GOAL = script_goal("packing", f"packing modes, untargeted ({SCRIPT}): padding, documents cut, tokens/s against "
                   "concat", Script(SCRIPT, argv))
