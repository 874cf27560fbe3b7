"""The figure of docs/mixing.md ("Reading the picture"): a steered run of the bundled curriculum, drawn.

    python scripts/mixing_figure.py [OUT_DIR]

Runs configs/data/curriculum_main.toml for 240 global steps in this process (8 lanes, on 2 then 4
data-parallel groups: ``zephon_core.verify.simulate``), steered by ODM every 10 steps over a stand-in
loss, writing every group's batch audit log as the adapters do and the checkpoint at the end, then
draws ``OUT_DIR/mixing_report.png`` with ``zephon report LOGS --journal STATE --plot`` (OUT_DIR:
docs/img). tests/unit/core/report/test_mixing_report.py runs it into a temporary folder.

The stand-in loss of a source falls as the run trains on it, ``a + b / sqrt(1 + T / 20,000)`` (``T``
its tokens so far), so the controller's choices feed back into the figures it sees next.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zephon_core.cli import main
from zephon_core.curriculum.controllers import OdmController
from zephon_core.integration.batch_log import log_line
from zephon_core.pipeline.mixing import LocalFigures, Mixing, MixingLoader
from zephon_core.recipe import load_recipe
from zephon_core.verify.simulate import Phase, run_phase

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "configs/data/curriculum_main.toml"
PHASES = ((2, 120), (4, 120))  # (data-parallel groups, global steps): a resize at step 120
BATCHES_PER_STEP = 8  # global_batch_size 16 / batch_size 2
LOSS = ((1.2, 0.8), (2.0, 1.0), (2.4, 2.0))  # (a, b) per source: examples, reference, prose


def stand_in_loss(source: int, trained: int) -> float:
    """The loss per token of ``source`` after ``trained`` of its tokens: the run learns each source as it sees it."""
    a, b = LOSS[source]
    return a + b / (1 + trained / 20_000) ** 0.5


def mixing() -> Mixing:
    return Mixing(OdmController(alpha=0.5), interval_steps=10, min_share=0.05, max_change=0.1)


class Steering:
    """The training loop's part: per step, each source's tokens and the stand-in loss on them, then a decision."""

    def __init__(self) -> None:
        self.step = 0
        self.trained = [0, 0, 0]
        self.tokens = [0, 0, 0]

    def on_batch(self, log: Callable[[int, Any], None]) -> Callable[[int, Any], None]:
        def seen(group: int, batch: Any) -> None:
            log(group, batch)
            for _, source, _, start, stop in batch.segments.tolist():
                self.tokens[source] += stop - start
        return seen

    def after_step(self, loaders: list[MixingLoader]) -> None:
        self.step += 1
        sums = [n * stand_in_loss(s, self.trained[s]) for s, n in enumerate(self.tokens)]
        for s, n in enumerate(self.tokens):
            self.trained[s] += n
        for ld in loaders:  # every group gets the figures reduced over the groups, as the all-reduce gives them
            ld.record_loss(sums, self.tokens)
        self.tokens = [0, 0, 0]
        if loaders[0].due(self.step):
            figures = LocalFigures.reduced([ld.local_figures() for ld in loaders])
            for ld in loaders:
                ld.decide(self.step, figures)


def simulate(logs: Path) -> dict[str, Any]:
    """The steered run, with one audit log per data-parallel group (``batches-rank<group>.log``); its last state."""
    recipe = load_recipe(ROOT / RECIPE)
    files: dict[int, Any] = {}

    def log(group: int, batch: Any) -> None:
        if group not in files:
            files[group] = open(logs / f"batches-rank{group}.log", "a", encoding="utf-8")
        files[group].write(log_line(batch))

    def make(G: int, g: int) -> MixingLoader:
        return MixingLoader(recipe.build_standalone(dp_degree=G, dp_group_id=g, prefetch=0), mixing())

    steering, state = Steering(), None
    try:
        for groups, steps in PHASES:
            _, state = run_phase(make, Phase(groups, steps), BATCHES_PER_STEP, state,
                                 on_batch=steering.on_batch(log), after_step=steering.after_step)
    finally:
        for f in files.values():
            f.close()
    assert state is not None
    return state


def make_figure(out: Path) -> None:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)  # the picture names the recipe as docs/mixing.md does: from the repository root
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "logs"
        logs.mkdir()
        state = Path(tmp) / "step-240.json"
        state.write_text(json.dumps(simulate(logs)), encoding="utf-8")
        if main(["report", str(logs), "--recipe", RECIPE, "--journal", str(state),
                 "--plot", str(out / "mixing_report.png")]):
            raise SystemExit("zephon report failed")


if __name__ == "__main__":
    make_figure(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "img")
