"""A mixture TorchTitan's run steers, checkpointed and resumed on another data-parallel degree (issue #34).

Two launches of TorchTitan 0.3 on CPU over three token-array sources mixed 1:1:1, with the recipe's
``[mixing]`` on (a schedule controller from a file, asked after every step: four changes of the mix):

* ``steered``: dp=2, 8 steps, uninterrupted, a checkpoint every 2 steps;
* ``resumed``: dp=1 from ``steered``'s step-4 checkpoint (two decisions replayed), to step 8.

Every global step's batches (the audit log's digests) of both runs equal what ``zephon_core`` alone gives for
the recipe with the final checkpoint's journal replayed (``pipeline.mixing.replay``, built in this process),
both runs journal the same decisions, and the tokens each stage's lanes delivered follow its weights.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from support.mixing_journals import check_resumed_journal, steered_recipe

from zephon_core.pipeline.mixing import replay

pytestmark = pytest.mark.e2e
C, STEPS = 4, 8
NAMES = ("examples", "prose", "reference")
SCHEDULE = {2: (6, 3, 1), 3: (1, 1, 8), 5: (2, 6, 2), 6: (4, 1, 5)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from torchtitan_cpu.runs import GLOBAL_BATCH, launch, token_corpora

    root = tmp_path_factory.mktemp("tt-mixing")
    token_corpora(root)
    recipe = steered_recipe(root, NAMES, SCHEDULE, lanes=C, head=f"global_batch_size = {GLOBAL_BATCH}\n")
    opts = dict(steps=STEPS, metrics=True, source_loss=True, mixing=True, loader={"recipe": str(recipe)})
    a = launch("0.3", 2, root / "steered", **opts)
    b = launch("0.3", 1, root / "resumed", resume_from=root / "steered" / "checkpoint" / "step-4", **opts)
    return recipe, (a, root / "steered"), (b, root / "resumed")


def built(recipe):
    """The recipe's pipeline as TorchTitan's launches build it, on one data-parallel group."""
    from torchtitan_cpu.runs import GLOBAL_BATCH, LOCAL_BATCH, SEQ_LEN

    from zephon_core.recipe import load_recipe

    return load_recipe(recipe).build(seq_len=SEQ_LEN, batch_size=LOCAL_BATCH, global_batch_size=GLOBAL_BATCH,
                                     canonical_replicas=C, dp_degree=1, dp_group_id=0, prefetch=0)


def reference_steps(recipe, state):
    """Step -> {(lane, lane_index): digest} of the recipe with ``state``'s journal replayed, from zephon_core alone."""
    from torchtitan_cpu.runs import GLOBAL_BATCH, LOCAL_BATCH

    per_lane = GLOBAL_BATCH // LOCAL_BATCH // C
    out: dict[int, dict[tuple[int, int], str]] = {}
    with replay(built(recipe), state) as p:
        it = iter(p)
        for _ in range(STEPS * C * per_lane):
            b = next(it)
            out.setdefault(b.lane_index // per_lane + 1, {})[(b.lane, b.lane_index)] = b.digest
    return out


def test_a_steered_run_resumed_on_another_degree_trains_on_the_replay_of_its_journal(runs):
    from torchtitan_cpu.runs import steps_of

    from zephon_core.curriculum.definition import parse_definition
    from zephon_core.curriculum.journal import DENOMINATOR
    from zephon_torchtitan.state import read_dcp_state

    recipe, (a, dir_a), (b, dir_b) = runs
    assert sorted(a.losses) == list(range(1, STEPS + 1))
    assert b.start_step == 5 and b.loaded_checkpoint and "step-4" in b.loaded_checkpoint
    final_a = read_dcp_state(str(dir_a / "checkpoint" / f"step-{STEPS}"))
    final_b = read_dcp_state(str(dir_b / "checkpoint" / f"step-{STEPS}"))
    journal, resumed_journal = (parse_definition(s["definition"]).journal for s in (final_a, final_b))
    check_resumed_journal(journal, resumed_journal, SCHEDULE, NAMES, replayed=2)
    assert len(re.findall(r"zephon: mixing decision \d+ after step", a.log_text())) == len(SCHEDULE)
    assert len(re.findall(r"zephon: mixing decision \d+ after step", b.log_text())) == 2, "steps 5 and 6 only"

    want = reference_steps(recipe, final_b)
    steered, resumed = steps_of(dir_a, C), steps_of(dir_b, C)
    assert sorted(steered) == list(range(1, STEPS + 1)) and sorted(resumed) == list(range(5, STEPS + 1))
    assert steered == want
    assert resumed == {s: want[s] for s in resumed}

    # What the run trained on follows the journal: the source a decision weighs most is the one most trained on in
    # the two steps after it takes hold (the lag: a stage starts at the read frontier, so rows of the stage before
    # still finish), both runs alike (their audit logs are equal above).
    trained = tokens_by_step(dir_a)
    for first, d in ((3, journal.decisions[0]), (5, journal.decisions[1]), (7, journal.decisions[-1])):
        counts = [trained[first][s] + trained[first + 1][s] for s in range(len(NAMES))]
        assert max(range(len(NAMES)), key=counts.__getitem__) == NAMES.index(max(d.weights, key=d.weights.get))
    # Over 100k tokens of the last stage (the replay reference continued: the run's data, had it gone on) the
    # realized token shares are the stage's weights within 1 pp.
    last = realized_shares(recipe, final_b, len(journal.decisions), 100_000)
    for n, share in zip(NAMES, last):
        assert abs(share - journal.decisions[-1].weights[n] / DENOMINATOR) < 0.01, (n, last)


def tokens_by_step(dump) -> dict[int, Counter[int]]:
    """Step -> tokens of each source (by number) in the rows every rank delivered (the audit logs)."""
    from torchtitan_cpu.runs import GLOBAL_BATCH, LOCAL_BATCH

    from zephon_core.integration.batch_log import read_batch_log

    out: dict[int, Counter[int]] = {}
    for f in dump.glob("batches-rank*.log"):
        for b in read_batch_log(f):
            out.setdefault(b.lane_index // (GLOBAL_BATCH // LOCAL_BATCH // C) + 1, Counter()).update(b.tokens)
    return out


def realized_shares(recipe, state, stage: int, tokens: int) -> list[float]:
    """The token shares of the sources in the replay reference's batches that count in ``stage``, over ``tokens``."""
    counts: Counter[int] = Counter()
    with replay(built(recipe), state) as p:
        for b in p:
            if b.stage == stage:
                seg = b.segments
                for src, n in zip(seg[:, 1].tolist(), (seg[:, 4] - seg[:, 3]).tolist()):
                    counts[src] += n
            if sum(counts.values()) >= tokens:
                break
    return [counts[s] / sum(counts.values()) for s in range(len(NAMES))]
