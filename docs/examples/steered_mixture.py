"""A mixture the run steers by its losses (docs/mixing.md): ODM decides every 10 steps, each decision becomes a
stage at the read frontier, a checkpoint holds the journal, and a resume replays it.

The losses here are a stand-in (a fixed loss per token for each source, falling as the run goes on): in
training they are the model's, summed per source and reduced over the data-parallel groups.

Run with: python docs/examples/steered_mixture.py
"""

import json

from common import steer

from zephon_core.curriculum.controllers import OdmController
from zephon_core.pipeline.mixing import Mixing, MixingLoader
from zephon_core.recipe import load_recipe

recipe = load_recipe("configs/data/curriculum_main.toml")  # 8 lanes, batches of 2 rows of 129 tokens
LOSS = {"examples": 2.0, "reference": 3.0, "prose": 2.5}  # the stand-in: prose and reference are "harder"


def loader():
    mixing = Mixing(OdmController(alpha=0.9), interval_steps=10, min_share=0.1, max_change=0.1)
    return MixingLoader(recipe.build_standalone(prefetch=2), mixing)


def train(run, first, last, decisions):
    """Steps ``first..last`` of 8 batches (one per lane), the losses falling as the run goes on: batch digests."""
    return steer(run, first, last, lambda name, n, step: n * LOSS[name] / (1 + step / 100), decisions)


decisions = []
run = loader()
before = train(run, 1, 40, decisions)
state = json.loads(json.dumps(run.checkpoint()))  # the journal travels in the state's definition
after = train(run, 41, 80, decisions)
run.close()
for d in decisions:
    print(d.summary())

resumed = loader()
resumed.restore(state)  # replays the journal; the controller continues from its journaled state
replayed = []
again = train(resumed, 41, 80, replayed)
resumed.close()
print(f"resumed at step 40: {len(state['definition']['work_source']['journal']['decisions'])} decisions replayed, "
      f"{len(replayed)} made again after; steps 41-80 identical: {again == after}")
