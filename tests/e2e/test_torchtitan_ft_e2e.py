"""TorchTitan 0.3's torchft trainer fed by Zephon's live mode, on CPU: a replica group killed and restarted mid-run.

Two replica groups (one torchrun launch of one process each, gloo) under torchft's lighthouse, run
in this process. Replica 1 is killed (SIGKILL of its whole launch) once it has committed a few
steps, replica 0 trains on alone with all the lanes, and replica 1 is started again: torchft heals
it (model, optimizer, trainer step and Zephon's lanes table) and the two split the lanes again.
Every committed step's samples, read from the batch audit logs, equal that step of an uninterrupted
run, and the durable checkpoint (TorchTitan's main one) restores offline on another data-parallel
degree at exactly the next step. Three launches, about 2 minutes on 2 cores.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from torchtitan_cpu import harness
from torchtitan_cpu.runs import ASSETS, LOCAL_BATCH, RECIPE, ROOT, SEQ_LEN

from zephon_core.integration.batch_log import read_batch_log

pytestmark = pytest.mark.e2e
pytest.importorskip("torchft")
pytest.importorskip("torchtitan.experiments.torchft")

C, K = 4, 1  # tt_train.toml's lanes; the recipe's 8 rows a step / 2 per batch = 4 batches = 1 per lane
KILL_AFTER = 3  # replica 1's committed steps before it is killed
AFTER_REJOIN = 4  # steps the restarted replica 1 commits before the test stops the run
DEADLINE_S = 420


def _launch(dump: Path, replica: int, lighthouse: str, procs: dict[int, subprocess.Popen], results: dict) -> None:
    args = ["--module", "zephon_torchtitan", "--config", "llama3_debugmodel_zephon_ft", "--hf_assets_path", str(ASSETS),
            "--dump_folder", str(dump), "--dataloader.recipe", str(RECIPE), "--training.steps", "1000",
            "--training.mixed_precision_param", "float32", "--metrics.log_freq", "1", "--checkpoint.interval", "4",
            "--fault_tolerance.replica_id", str(replica), "--fault_tolerance.group_size", "1",
            "--fault_tolerance.process_group_timeout_ms", "5000"]
    paths = (ROOT, ROOT / "integrations" / "torchtitan", ROOT / "integrations" / "torchft")
    env = {"PYTHONPATH": os.pathsep.join(map(str, paths)),
           "TORCHFT_LIGHTHOUSE": lighthouse, "ZEPHON_BATCH_LOG": str(dump / "batches-rank{rank}.log")}
    results[replica] = harness.run_torchtitan("0.3", 1, args, dump, env=env, cpu_defaults=False, timeout=DEADLINE_S,
                                              check=False, started=lambda p: procs.__setitem__(replica, p))


def _committed(dump: Path, skip: int = 0) -> list:
    from zephon_torchtitan.ft import read_step_log

    path = dump / "batches-rank0.log.steps"
    return [r for r in read_step_log(path)[skip:] if r.committed] if path.exists() else []


def _wait(what: str, ready, deadline: float) -> None:
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.5)


def _descendants(pid: int) -> list[int]:
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return children + [d for c in children for d in _descendants(c)]


def _stop(proc: subprocess.Popen) -> None:
    """SIGKILL a launch: its trainer process first (torchrun starts it in a session of its own), then torchrun."""
    for pid in [*reversed(_descendants(proc.pid)), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def ft_run(tmp_path_factory):
    """The run: replica 0 throughout; replica 1 killed after KILL_AFTER committed steps and started again."""
    from torchft.coordination import LighthouseServer

    root = tmp_path_factory.mktemp("tt-ft")
    dumps = {r: root / f"replica{r}" for r in (0, 1)}
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=1000, quorum_tick_ms=50,
                                  heartbeat_timeout_ms=2000)
    procs: dict[int, subprocess.Popen] = {}
    results: dict = {}
    deadline = time.monotonic() + DEADLINE_S
    address = lighthouse.address()
    threads = [threading.Thread(target=_launch, args=(dumps[r], r, address, procs, results)) for r in (0, 1)]
    try:
        for t in threads:
            t.start()
        _wait(f"replica 1 committed {KILL_AFTER} steps", lambda: len(_committed(dumps[1])) >= KILL_AFTER, deadline)
        _stop(procs[1])
        threads[1].join()
        before = len((dumps[1] / "batches-rank0.log.steps").read_text().splitlines())
        restart = threading.Thread(target=_launch, args=(dumps[1], 1, address, procs, results))
        restart.start()
        threads.append(restart)
        _wait(f"the restarted replica 1 committed {AFTER_REJOIN} steps",
              lambda: len(_committed(dumps[1], before)) >= AFTER_REJOIN, deadline)
    finally:
        for p in procs.values():
            _stop(p)
        for t in threads:
            t.join(timeout=120)
        lighthouse.shutdown()
    return dumps, before


def _make(slots: int, slot: int):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from zephon_torchtitan.core import ZephonStream
    from zephon_torchtitan.settings import Settings

    tok = HuggingFaceTokenizer(tokenizer_path=str(ASSETS))
    stream = ZephonStream(Settings(recipe=str(RECIPE)), dp_world_size=slots, dp_rank=slot, tokenizer=tok,
                          seq_len=SEQ_LEN, local_batch_size=LOCAL_BATCH, batches_per_step=C * K)
    return stream.pipeline


def test_every_committed_step_holds_exactly_its_samples(ft_run):
    from zephon_core.live.simulate import reference_steps
    from zephon_torchtitan.ft import read_step_log

    dumps, before = ft_run
    records = {r: read_step_log(d / "batches-rank0.log.steps") for r, d in dumps.items()}
    committed = sorted({rec.step for recs in records.values() for rec in recs if rec.committed})
    assert committed == list(range(len(committed))), f"committed steps are not 0..n-1: {committed}"
    batches: dict[tuple[int, int], str] = {}
    for d in dumps.values():
        for b in read_batch_log(d / "batches-rank0.log"):
            same = batches.setdefault((b.lane, b.lane_index), b.digest) == b.digest
            assert same, "two attempts cut different batches"
    steps: dict[int, list] = defaultdict(list)
    for (lane, index), digest in batches.items():
        steps[index // K].append((lane, index, digest))
    reference = reference_steps(_make, C, K, len(committed) + 2)
    for s in committed:
        assert sorted(steps[s]) == reference[s], f"committed step {s} differs from the uninterrupted run"
    for s, got in steps.items():  # attempts never cut other data, committed or not
        assert set(got) <= set(reference.get(s, got)), f"step {s} attempt cut batches outside the reference"
    # The run did what it was meant to: replica 0 alone with every lane while replica 1 was down, both after.
    # Its own healing step (when replica 1 formed the first quorum alone: both start at once) serves no lane.
    alone = [r for r in records[0] if r.committed and r.participants == 1 and r.position is not None]
    assert alone and all(r.lanes == (0, 1, 2, 3) for r in alone)
    heal, *rejoined = [r for r in records[1][before:] if r.committed]
    assert heal.step > KILL_AFTER and heal.position is None and not heal.lanes, "the restarted replica did not heal"
    assert rejoined and all(r.participants == 2 and len(r.lanes) == 2 for r in rejoined), "no split of the lanes"
    leader = {r.step: r.trainer_step for r in records[0] if r.committed}
    assert all(leader.get(r.step, r.trainer_step) == r.trainer_step for r in rejoined), "the trainer steps differ"


def test_the_durable_checkpoint_restores_offline_on_another_dp_degree(ft_run):
    from zephon_core.checkpoint.state import parse_lanes
    from zephon_core.live.simulate import reference_steps
    from zephon_torchtitan.state import read_dcp_state

    dumps, _ = ft_run
    folders = sorted((p for p in (dumps[0] / "checkpoint").glob("step-*") if (p / ".metadata").exists()),
                     key=lambda p: int(p.name.split("-")[1]))
    assert folders, "replica 0 wrote no checkpoint"
    state = read_dcp_state(str(folders[-1]))
    delivered = {st.delivered for st in parse_lanes(state).values()}
    assert len(delivered) == 1, f"the checkpoint's lanes are not at one step boundary: {delivered}"
    step = delivered.pop() // K
    reference = reference_steps(_make, C, K, step + 2)
    got: list = []
    for slot in (0, 1):  # dp=2 offline, where the run had one rank per replica group
        with _make(2, slot) as p:
            p.restore(state)
            it = iter(p)
            got += [next(it) for _ in range(2 * K * C // 2)]
    by_step: dict[int, list] = defaultdict(list)
    for b in got:
        by_step[b.lane_index // K].append((b.lane, b.lane_index, b.digest))
    assert {s: sorted(v) for s, v in by_step.items()} == {s: reference[s] for s in (step, step + 1)}
