"""The curriculum study (curriculum.py, this package): staged curricula on the bench corpus. Untargeted: results.md
shows what it measured (realized token shares against the weights, where a stage's boundary fell, throughput of static
and staged mixtures, the token index's cost); docs/performance.md reads them."""

from __future__ import annotations

from goal import Script, script_goal
from harness import Context


def argv(ctx: Context) -> list[str]:
    return [*(["--quick"] if ctx.quick else []), "--out", str(ctx.results / "curriculum.json")]


SCRIPT = "bench/goals/study_curriculum/curriculum.py"
GOAL = script_goal("curriculum", f"staged curricula, untargeted ({SCRIPT}): token shares against the weights, "
                   "stage boundaries, throughput, token index cost", Script(SCRIPT, argv))
