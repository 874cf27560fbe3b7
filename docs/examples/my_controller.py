"""A mixing controller of your own (docs/controllers.md), named by a recipe as "my_controller:LossChaser".

LossChaser gives each source a share in proportion to its mean loss per token over the interval, raised
to ``power`` (its one recipe key): the sources the model finds harder get more. The recipe below is the
bundled curriculum with a [mixing] table naming it by its path; the loader steers by a stand-in loss,
checkpoints at step 20 and resumes.

Its folder is on the Python path when it runs, so the recipe's "my_controller:LossChaser" imports this
file as the module my_controller (only running it trains).

Run with: python docs/examples/my_controller.py
"""

from __future__ import annotations

import json
import tomllib

from zephon_core.curriculum.controllers import ControllerArgs, MixingInputs


class LossChaser:
    name = "loss_chaser"  # what the journal and the steering clock record
    keys = ("power",)  # its own keys of the [mixing] table

    def __init__(self, power: float = 1.0) -> None:
        self.power = power
        self.asked = 0

    @classmethod
    def from_args(cls, args: ControllerArgs) -> LossChaser:
        power = args.number("power", 1.0)
        if power <= 0:
            raise args.error("power", f"must be > 0, got {power}")
        return cls(power)

    def params(self) -> dict:
        return {"power": self.power}

    def propose(self, inputs: MixingInputs) -> list[float] | None:
        self.asked += 1
        losses = inputs.mean_loss()
        if None in losses:  # a source no token of which was trained: keep the weights
            return None
        return [loss**self.power for loss in losses]

    def state(self) -> dict:
        return {"asked": self.asked}

    def load_state(self, state: dict) -> None:
        self.asked = int(state["asked"])


MIXING = """
[mixing]
controller = "my_controller:LossChaser"
interval_steps = 10
max_change = 0.05
power = 2.0
"""
LOSS = {"examples": 2.0, "reference": 3.0, "prose": 2.5}  # a stand-in for the model's loss per token


def main():
    from common import steer

    from zephon_core.pipeline.mixing import MixingLoader
    from zephon_core.recipe import load_recipe

    def train(run, first, last, decisions):
        return steer(run, first, last, lambda name, n, step: n * LOSS[name], decisions)

    recipe = load_recipe("configs/data/curriculum_main.toml", overrides=tomllib.loads(MIXING))
    run = MixingLoader(recipe.build_standalone(prefetch=2), recipe.mixing())
    decisions = []
    train(run, 1, 20, decisions)
    state = json.loads(json.dumps(run.checkpoint()))
    after = train(run, 21, 40, decisions)
    run.close()
    for d in decisions:
        print(d.summary())
    resumed = MixingLoader(recipe.build_standalone(prefetch=2), recipe.mixing())
    resumed.restore(state)  # the state names "loss_chaser": the recipe built it; the state imports nothing
    again = train(resumed, 21, 40, [])
    resumed.close()
    print(f"controller {state['steering']['controller']!r} asked {resumed.mixing.controller.asked} times; "
          f"steps 21-40 identical after the resume: {again == after}")


if __name__ == "__main__":  # the recipe imports this file as my_controller: only running it trains
    main()
