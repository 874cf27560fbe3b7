"""Steering and surgery under live mode (torchft): refused at start-up in one line naming the reason and the fix
(``live_data_problems``, which ``LiveLanes``, TorchTitan's live loader and the drill share), except a surgery journal
the lanes have passed, which holds exactly: a healing group adopts its peer's journal with the table."""

from __future__ import annotations

import numpy as np
import pytest
from support.core_fixtures import mixture, token_pipeline

from zephon_core import MemorySource, Pipeline, StaticMixture
from zephon_core.curriculum.controllers import IdentityController
from zephon_core.errors import ConfigError
from zephon_core.live import LiveLanes, live_data_problems
from zephon_core.pipeline.mixing import Mixing, MixingLoader
from zephon_core.pipeline.surgery import quarantined_state

C, K = 4, 1


def make() -> Pipeline:
    ws = mixture((120, 80), (0.7, 0.3))
    return token_pipeline(ws, seq_len=12, batch_size=2, shuffle_window=3, canonical_replicas=C)


@pytest.mark.parametrize("asked, needle", [
    (dict(mixing=True), "steering (mixing) is refused in live mode (torchft)"),
    (dict(surgery="run.toml: surgery"), "run.toml: surgery: a [surgery] table (skip_steps, quarantine) is refused"),
    (dict(skip_ahead="steps 2..3"), "the loader state's surgery journal skips steps 2..3, which live mode"),
])
def test_each_refusal_is_one_line_with_the_reason_and_the_fix(asked, needle):
    problems = live_data_problems(**asked, without_torchft="--module x without torchft")
    assert len(problems) == 1 and "\n" not in problems[0] and problems[0].startswith(needle)
    assert "--module x without torchft" in problems[0]
    assert live_data_problems() == []


def _steered() -> MixingLoader:
    sources = [MemorySource([[i * 100 + d] * 5 for d in range(40)], name=f"s{i}") for i in range(2)]
    pipeline = (Pipeline(StaticMixture(sources, [1, 1], seed=4, chunk_size=8)).pack(8).batch(2)
                .options(canonical_replicas=C, prefetch=0))
    return MixingLoader(pipeline, Mixing(IdentityController({"s0": 3, "s1": 1}), interval_steps=1))


def test_steering_is_refused_a_mixing_loader_and_the_pipeline_it_rebuilt_for_a_decision():
    loader = _steered()
    with pytest.raises(ConfigError, match=r"^live mode: steering \(mixing\) is refused in live mode"):
        LiveLanes(loader, K)  # type: ignore[arg-type]
    it = iter(loader)
    for _ in range(C * K):  # one whole step: the rebuilt pipeline stands at a step boundary
        next(it)
    loader.record_loss([1.0, 2.0], [10, 10])
    assert loader.decide(1) is not None
    with pytest.raises(ConfigError, match=r"^live mode: steering \(mixing\) is refused"):
        LiveLanes(loader.pipeline, K)
    loader.pipeline.close()


def test_a_journaled_skip_still_ahead_is_refused_and_one_the_lanes_passed_is_not():
    ahead = make()
    ahead.skip_steps(2, 3, C * K)
    with pytest.raises(ConfigError, match=r"^live mode: the loader state's surgery journal skips steps 2\.\.3"):
        LiveLanes(ahead, K)
    past = make()
    it = iter(past)
    for _ in range(4 * C * K):  # through step 4: the skip (steps 2..3) is behind the lanes
        next(it)
    state = past.checkpoint()
    past.close()
    skipped = make()
    skipped.skip_steps(2, 3, C * K)
    restored = make()
    restored.restore(state)
    restored.surgery = skipped.surgery
    LiveLanes(restored, K).close()


def test_a_healing_group_adopts_its_peers_quarantine_with_the_table():
    probe = LiveLanes(make(), K)
    first = probe.begin(1, 0).batches
    probe.close()
    src, doc = first[0].segments[0, 1], first[0].segments[0, 2]  # a document of step 0: quarantined from chunk 0
    name = f"src{int(src)}"
    state = quarantined_state(make(), make().checkpoint(), [(name, int(doc))])
    quarantined = make()
    quarantined.restore(state)
    peer, joiner = LiveLanes(quarantined, K), LiveLanes(make(), K)
    joiner.load_state_dict(peer.state_dict())
    want, got = peer.begin(1, 0).batches, joiner.begin(1, 0).batches
    assert [b.digest for b in got] == [b.digest for b in want]
    assert not any(np.any((b.segments[:, 1] == src) & (b.segments[:, 2] == doc)) for b in got)
    assert joiner.checkpoint().get("surgery") == peer.checkpoint().get("surgery")
    peer.close()
    joiner.close()
