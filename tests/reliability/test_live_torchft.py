"""Live elasticity with real parts: torchft 0.2.0's lighthouse and Managers, gloo on loopback, replica groups as
processes (``zephon_torchft.drill``), faults scripted by step.

One launch per quorum mode runs the whole fault script, a case after the other: a replica killed
before the step's allreduce (the step is discarded and retried without it), one killed after the
table's allreduce but before the commit (its samples are in the step that commits without it), a
replica joining (it heals: the table comes with torchft's state transfer), then a leave/join storm
(a kill between the gradients' and the table's allreduces, a join and a kill after the allreduce
within a few steps). Every committed step's samples, read from the processes' logs, must equal that
step of an uninterrupted run (``reference_steps``): nothing lost or repeated. The durable checkpoint
of the sync run then restores offline on other data-parallel degrees and into a new live run of
another replica count, and continues exactly. Sync quorum trains 12 lanes, 1 batch per lane per
step; async quorum (``init_sync=False``) 10 lanes and 2 batches per lane, so three participants
leave one of them a spare that runs zero-weight pads.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cache

import pytest

pytest.importorskip("torchft")

from zephon_core.live.simulate import LiveRun, reference_steps, violations  # noqa: E402
from zephon_core.recipe import Recipe  # noqa: E402
from zephon_dev.torchft_drill import Drill, Replica, launch, loss_counts  # noqa: E402
from zephon_torchft.drill_log import committed_steps  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

STEPS = 16
MODES = {"sync": ["--mode", "sync", "--canonical-replicas", "12", "--batches-per-lane", "1"],
         "async": ["--mode", "async", "--canonical-replicas", "10", "--batches-per-lane", "2"]}
PACE = ["--pace", "0.15"]

#: The fault script: (case, first step, replicas). r3 joins at 4 and dies at 10 between the gradients' allreduces and
#: the table's, r4 and r5 join at 8 and 10, r0 dies at 13 after the allreduce: never fewer than 2 replicas alive.
SCRIPT = [
    Replica(0, die_at=13, die_when="after_allreduce"),
    Replica(1, die_at=3, die_when="before_allreduce"),
    Replica(2, die_at=7, die_when="after_allreduce"),
    Replica(3, join_at=4, die_at=10, die_when="before_exchange"),
    Replica(4, join_at=8),
    Replica(5, join_at=10),
]
CASES = {"kill before the allreduce": (3, 4), "join": (4, 7), "kill after the allreduce, before the commit": (7, 8),
         "leave/join storm": (8, STEPS)}


def recipe(mode_args: list[str]) -> Recipe:
    from zephon_torchft import drill

    args = ["--lighthouse", "-", "--replica-id", "0", "--steps", "1", "--log", "-", *mode_args]
    return drill.load(drill.parse_args(args))


@cache
def reference(mode: str, steps: int) -> dict[int, list[tuple[int, int, str]]]:
    r = recipe(MODES[mode])
    C, k = r.spec.canonical_replicas, int(MODES[mode][-1])
    assert C is not None
    return reference_steps(lambda slots, slot: r.build_standalone(dp_degree=slots, dp_group_id=slot), C, k, steps)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Drill]:
    """The fault script, once per quorum mode."""
    return {mode: launch(tmp_path_factory.mktemp(f"torchft-{mode}"), SCRIPT, steps=STEPS, args=[*args, *PACE])
            for mode, args in MODES.items()}


@pytest.mark.parametrize("mode", list(MODES))
def test_every_committed_step_keeps_its_samples(runs: dict[str, Drill], mode: str, rel) -> None:
    run = runs[mode]
    victims = {r.rid for r in SCRIPT if r.die_at is not None}
    assert {rid: code for rid, code in run.codes.items() if code != (1 if rid in victims else 0)} == {}, run.tail()
    steps, problems = committed_steps(run.logs)
    ref = reference(mode, STEPS)
    assert problems == [], problems
    assert violations(LiveRun(steps=steps), ref) == []
    assert sorted(steps) == list(range(STEPS))
    for case, (first, end) in CASES.items():
        window = {s: steps.get(s, []) for s in range(first, end)}
        expected, lost, repeated = loss_counts(window, {s: ref[s] for s in range(first, end)})
        rel.case(f"torchft {mode}: {case}", "pass" if lost == repeated == 0 else "fail", samples=expected, lost=lost,
                 duplicated=repeated)
    _faults_happened(run)


def _faults_happened(run: Drill) -> None:
    """The script really ran: each victim died where told, a discarded attempt was retried, the joiners committed."""
    lines = [line for replica_lines in run.logs.values() for line in replica_lines]
    died = {line["replica"]: (line["step"], line["died"]) for line in lines if line.get("died")}
    assert died == {r.rid: (r.die_at, r.die_when) for r in SCRIPT if r.die_at is not None}
    # A survivor's attempt at step 3 failed with r1 and was retried without it (which survivor depends on who was in
    # the quorum when r1 died: under load r0 may come up late and first join at the retry).
    assert any(line["committed"] is False and line["step"] == 3 for rid in (0, 2) for line in run.logs[rid]), \
        "step 3 was not retried"
    for r in SCRIPT:
        if r.join_at is not None:
            first = next(line for line in run.logs[r.rid] if line["committed"])
            assert first["step"] > r.join_at, (r.rid, first)  # it healed: it never trained the steps before it joined
    sizes = {line["participants"] for line in lines if line["committed"]}
    assert {2, 3} <= sizes, sizes


def test_durable_checkpoint_restores_offline_on_other_degrees(runs: dict[str, Drill]) -> None:
    """The sync run's durable checkpoints (one copy of all lanes) continue exactly on 2, 3 and 4 data-parallel
    groups."""
    r = recipe(MODES["sync"])
    ref = reference("sync", STEPS + 3)
    for at, degrees in ((8, (2, 3)), (STEPS, (3, 4))):
        state = json.loads((runs["sync"].durable / f"step-{at}.json").read_text())
        for dp in degrees:
            got: dict[int, list[tuple[int, int, str]]] = {}
            for g in range(dp):
                with r.build_standalone(dp_degree=dp, dp_group_id=g) as p:
                    p.restore(state)
                    it = iter(p)
                    for _ in range(3 * 12 // dp):
                        b = next(it)
                        got.setdefault(b.lane_index, []).append((b.lane, b.lane_index, b.digest))
            assert {s: sorted(v) for s, v in got.items()} == {s: ref[s] for s in range(at, at + 3)}, (at, dp)


def test_durable_checkpoint_restarts_a_live_run_of_another_size(runs: dict[str, Drill], tmp_path, rel) -> None:
    """A full restart from the last durable checkpoint of the 3-replica sync run, as 2 replicas in async quorum."""
    more = 4
    start = runs["sync"].durable / f"step-{STEPS}.json"
    run = launch(tmp_path, [Replica(10), Replica(11)], steps=STEPS + more,
                 args=["--restore", str(start), "--mode", "async", "--canonical-replicas", "12"])
    assert run.codes == {10: 0, 11: 0}, run.tail()
    steps, problems = committed_steps(run.logs)
    ref = reference("sync", STEPS + more)
    assert problems == []
    assert steps == {s: ref[s] for s in range(STEPS, STEPS + more)}
    expected, lost, repeated = loss_counts(steps, {s: ref[s] for s in range(STEPS, STEPS + more)})
    rel.case("torchft: restart from the durable checkpoint on 2 replicas", "pass", samples=expected, lost=lost,
             duplicated=repeated)


def test_async_quorum_with_init_sync_is_refused(tmp_path) -> None:
    run = launch(tmp_path, [Replica(0, extra=("--init-sync",))], steps=2, args=["--mode", "async"], min_replicas=1,
                 timeout_s=60)
    assert run.codes == {0: 2}, run.tail()
    last = run.stderr[0].strip().splitlines()[-1]
    assert "init_sync=True" in last and "init_sync=False" in last, last
    assert run.logs[0] == []


def test_replicas_of_different_recipes_are_refused(tmp_path) -> None:
    """Two replica groups whose data definitions differ (another shuffle seed): the first step does not commit."""
    from zephon_core.integration import bundled_configs

    demo = bundled_configs() / "data" / "demo.toml"
    other = tmp_path / "other.toml"
    text = demo.read_text().replace('"../corpus/', f'"{demo.parent.parent}/corpus/').replace("seed = 7", "seed = 8")
    other.write_text(text)
    run = launch(tmp_path / "run", [Replica(0), Replica(1, extra=("--recipe", str(other)))], steps=3,
                 args=["--mode", "async"], timeout_s=60)
    assert run.codes == {0: 2, 1: 2}, run.tail()
    for rid in (0, 1):
        last = run.stderr[rid].strip().splitlines()[-1]
        assert "disagree on the data definition" in last, last
    assert not any(line["committed"] for lines in run.logs.values() for line in lines)


def test_the_peer_sampler_loses_data_on_the_same_faults(tmp_path) -> None:
    """The baseline the bench compares with: torchft's ``DistributedSampler``, sharded by replica id over the most
    replica groups, on a kill before the allreduce. Its committed steps miss the discarded attempts' documents and the
    dead replica's shard."""
    steps, groups, batch = 8, 3, 2
    script = [Replica(0), Replica(1, die_at=3, die_when="before_allreduce"), Replica(2)]
    run = launch(tmp_path, script, steps=steps, args=["--loader", "torchft-sampler", "--max-groups", str(groups),
                                                       "--batch-size", str(batch), *PACE])
    assert run.codes == {0: 0, 1: 1, 2: 0}, run.tail()
    from zephon_torchft import drill

    args = ["--lighthouse", "-", "--steps", "1", "--log", "-", "--max-groups", str(groups)]
    corpus = recipe([]).resolve(recipe([]).spec.sources[0].path or "")
    documents = list(range(sum(1 for line in open(corpus, encoding="utf-8") if line.strip())))
    orders = [drill.ShardOrder(drill.parse_args([*args, "--replica-id", str(rid)]), documents) for rid in range(groups)]
    reference = Counter(order.at(i) for order in orders for i in range(steps * batch))  # an uninterrupted run
    trained = [line for lines in run.logs.values() for line in lines if line["committed"]]
    committed = Counter(d for line in trained for d in line["samples"])
    lost, repeated = sum((reference - committed).values()), sum(n - 1 for n in committed.values() if n > 1)
    assert lost >= (steps - 3) * batch, (lost, repeated)  # at least the dead replica's shard from step 3 on
