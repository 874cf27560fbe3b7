"""The ledger of a steered run by replay follows the state's mixing journal (issue #40, item 2): before, it cut the
recipe's own mixture, answered ``--document`` with the wrong steps (exit 0) and ``--replay`` reported differences
on a correct run."""

from __future__ import annotations

import json

from zephon_core import MemorySource, Pipeline, StaticMixture
from zephon_core.curriculum.controllers import ScheduleController
from zephon_core.curriculum.definition import parse_definition
from zephon_core.pipeline.mixing import LocalFigures, Mixing, MixingLoader
from zephon_core.verify.ledger import build_ledger
from zephon_core.verify.simulate import Phase, run_phase

C, B = 4, 4
NAMES = ("a", "b")


def _plain(dp_degree: int, dp_group_id: int) -> Pipeline:
    sources = [MemorySource([[10 * k + 1 + d % 5] * (2 + d % 4) for d in range(80)], name=n)
               for k, n in enumerate(NAMES)]
    return (Pipeline(StaticMixture(sources, [1, 1], seed=3, chunk_size=4)).pack(8).batch(2)
            .options(canonical_replicas=C, dp_degree=dp_degree, dp_group_id=dp_group_id, prefetch=0))


def _steered_run():
    """Two phases (dp 2, then 4) steered by a schedule that moves every weight twice; what each step trained on."""
    trained: list[tuple[int, int, str]] = []
    step = [0]

    def make(G, gid):
        schedule = ScheduleController([(2, {"a": 1, "b": 9}), (5, {"a": 9, "b": 1})])
        return MixingLoader(_plain(G, gid), Mixing(schedule, interval_steps=1))

    def after(loaders):
        step[0] += 1
        for ld in loaders:
            ld.record_loss([1.0, 1.0], [1, 1])
        figures = LocalFigures.reduced([ld.local_figures() for ld in loaders])
        for ld in loaders:
            ld.decide(step[0], figures)

    state = None
    for phase in (Phase(2, 4), Phase(4, 6)):
        _, state = run_phase(make, phase, B, state, after_step=after,
                             on_batch=lambda gid, b: trained.append((b.lane, b.lane_index, b.digest)))
        state = json.loads(json.dumps(state))
    return trained, state


def test_the_ledger_by_replay_of_a_steered_run_is_what_it_trained_on():
    trained, state = _steered_run()
    journal = parse_definition(state["definition"]).journal
    assert journal is not None and len(journal.decisions) == 2
    ledger = build_ledger(lambda: _plain(1, 0), state, B)
    assert ledger.digests == {(lane, index): digest for lane, index, digest in trained}
