"""A mixture Megatron's run steers, checkpointed and resumed on another data-parallel degree (issue #34).

Two launches of Megatron's wheel entry on CPU over three token-array sources mixed 1:1:1, with
``--zephon-source-loss --zephon-mixing`` and the recipe's ``[mixing]`` (a schedule controller from a file,
asked at every logged iteration: four changes of the mix):

* ``steered``: TP=2 x DP=2, 8 iterations, uninterrupted, a checkpoint every 2;
* ``resumed``: TP=2 x DP=1 from ``steered``'s iteration-4 checkpoint (two decisions replayed), to iteration 8.

Every iteration's micro-batches (the audit logs' digests) of both runs equal what ``zephon_core`` alone gives for
the recipe with the final loader state's journal replayed (``pipeline.mixing.replay``, built in this process), and
both runs journal the same decisions.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from support.mixing_journals import check_resumed_journal, steered_recipe

from zephon_core.pipeline.mixing import replay

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not __import__("importlib").util.find_spec("megatron"),
                                                  reason="megatron-core is not installed")]
STEPS = 8
NAMES = ("examples", "prose", "reference")
SCHEDULE = {2: (6, 3, 1), 3: (1, 1, 8), 5: (2, 6, 2), 6: (4, 1, 5)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from harnesses import load
    from torchtitan_cpu.runs import token_corpora

    h = load("megatron")
    root = tmp_path_factory.mktemp("mg-mixing")
    token_corpora(root)
    recipe = steered_recipe(root, NAMES, SCHEDULE, lanes=h.C)
    flags = ["--zephon-source-loss", "--zephon-mixing"]
    a = h.run(root, "steered", h.Zrun("wheel", 4, recipe, tp=2, train_iters=STEPS, save_interval=2, extra=flags))
    assert a.ok, a.log_tail()
    b = h.run(root, "resumed", h.Zrun("wheel", 2, recipe, tp=2, train_iters=STEPS, save_interval=2, extra=flags,
                                      load=a.run_dir / "ckpt", load_step=4, loader_states_from=a.run_dir / "loader"))
    assert b.ok, b.log_tail()
    return h, recipe, a, b


def final_state(run_dir):
    from zephon_megatron.state import find_state_file, read_loader_file

    path = find_state_file(str(run_dir / "loader"), STEPS, 0, pipeline_parallel=False)
    assert path is not None, f"no loader state of iteration {STEPS} in {run_dir}"
    return read_loader_file(path).state


def reference_steps(h, recipe, state):
    """Iteration -> {(lane, lane_index): digest} of the recipe with ``state``'s journal replayed, zephon_core alone."""
    from zephon_core.recipe import load_recipe

    step_of = h.lane_index_to_step([h.GBS // h.MBS], h.C)
    built = load_recipe(recipe).build(seq_len=h.SEQ, batch_size=h.MBS, global_batch_size=h.GBS, dp_degree=1,
                                      dp_group_id=0, canonical_replicas=h.C, prefetch=0)
    out: dict[int, dict[tuple[int, int], str]] = {}
    with replay(built, state) as p:
        for _, b in zip(range(STEPS * h.GBS // h.MBS), p):
            out.setdefault(step_of(b.lane_index), {})[(b.lane, b.lane_index)] = b.digest
    return out


def tokens_by_step(h, run) -> dict[int, Counter[int]]:
    """Iteration -> tokens of each source (by number) in the micro-batches the loading ranks logged, once each."""
    from zephon_core.integration.batch_log import read_batch_log

    step_of = h.lane_index_to_step([h.GBS // h.MBS], h.C)
    seen: dict[tuple[int, int], dict[int, int]] = {}
    for f in run.run_dir.glob("batches-rank*.log"):
        for b in read_batch_log(f):
            if b.tokens:  # tensor-parallel peers log the identity alone
                seen[(b.lane, b.lane_index)] = b.tokens
    out: dict[int, Counter[int]] = {}
    for (_, idx), tokens in seen.items():
        out.setdefault(step_of(idx), Counter()).update(tokens)
    return out


def test_a_steered_megatron_run_resumed_on_another_degree_trains_on_the_replay_of_its_journal(runs):
    from zephon_core.curriculum.definition import parse_definition

    h, recipe, a, b = runs
    assert "zephon: loader state restored at step 4 (16 batches delivered over 4 lanes) from dp=2 to dp=1" in b.text
    final_a, final_b = final_state(a.run_dir), final_state(b.run_dir)
    journal, resumed_journal = (parse_definition(s["definition"]).journal for s in (final_a, final_b))
    check_resumed_journal(journal, resumed_journal, SCHEDULE, NAMES, replayed=2)
    assert len(re.findall(r"zephon: mixing decision \d+ after iteration", a.text)) == len(SCHEDULE), "rank 0 says"
    assert len(re.findall(r"zephon: mixing decision \d+ after iteration", b.text)) == 2, "iterations 5 and 6 only"

    want = reference_steps(h, recipe, final_b)
    steered, resumed = a.steps(), b.steps()
    assert sorted(steered) == list(range(1, STEPS + 1)) and sorted(resumed) == list(range(5, STEPS + 1))
    assert steered == want
    assert resumed == {s: want[s] for s in resumed}

    # The mix did change: the source a decision weighs most is the one most trained on in the two iterations after
    # it takes hold (a stage starts at the read frontier, so rows of the stage before still finish).
    trained = tokens_by_step(h, a)
    for first, d in ((3, journal.decisions[0]), (5, journal.decisions[1]), (7, journal.decisions[-1])):
        counts = [trained[first][s] + trained[first + 1][s] for s in range(len(NAMES))]
        assert max(range(len(NAMES)), key=counts.__getitem__) == NAMES.index(max(d.weights, key=d.weights.get))
