"""The two figures of docs/cli.md ("Watching a run"): the plan and a run of the bundled three-stage curriculum.

    python scripts/watch_figures.py [OUT_DIR]

Runs configs/data/curriculum.toml for 90 global steps in this process (8 lanes,
on 2, then 4, then 8 data-parallel groups: ``zephon_core.verify.simulate``), writing
every group's batch audit log as the adapters do, then draws
``OUT_DIR/watch_plan.png`` with ``zephon explain --plot`` and
``OUT_DIR/watch_report.png`` with ``zephon report --plot`` (OUT_DIR: docs/img).
tests/unit/core/report/test_report.py runs it into a temporary folder.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from zephon_core.cli import main
from zephon_core.integration.batch_log import log_line
from zephon_core.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]
from zephon_core.verify.shape import Shape, build  # noqa: E402
from zephon_core.verify.simulate import Phase, run_phase  # noqa: E402

RECIPE = "configs/data/curriculum.toml"
PHASES = ((2, 30), (4, 30), (8, 30))  # (data-parallel groups, global steps): a resize at steps 30 and 60
BATCHES_PER_STEP = 8  # global_batch_size 16 / batch_size 2


def simulate(logs: Path) -> None:
    """The run, with one audit log per data-parallel group (``batches-rank<group>.log``)."""
    recipe = load_recipe(RECIPE)
    files = {}

    def log(group: int, batch) -> None:
        if group not in files:
            files[group] = open(logs / f"batches-rank{group}.log", "a", encoding="utf-8")
        files[group].write(log_line(batch))

    state = None
    try:
        for groups, steps in PHASES:
            make = lambda G, g: build(recipe, Shape(), dp_degree=G, dp_group_id=g, prefetch=0)  # noqa: E731
            _, state = run_phase(make, Phase(groups, steps), BATCHES_PER_STEP, state, on_batch=log)
    finally:
        for f in files.values():
            f.close()


def make_figures(out: Path) -> None:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)  # the pictures name the recipe as docs/cli.md does: from the repository root
    steps = str(sum(n for _, n in PHASES))
    with tempfile.TemporaryDirectory() as tmp:
        simulate(Path(tmp))
        if main(["report", tmp, "--recipe", RECIPE, "--plot", str(out / "watch_report.png")]):
            raise SystemExit("zephon report failed")
    if main(["explain", RECIPE, "--plot", str(out / "watch_plan.png"), "--plot-steps", steps]):
        raise SystemExit("zephon explain failed")


if __name__ == "__main__":
    make_figures(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "img")
