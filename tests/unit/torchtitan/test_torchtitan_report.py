"""``zephon report`` on a TorchTitan dump folder: its ``checkpoint/step-N`` DCP folders, read in step order."""

from __future__ import annotations

import pytest

from zephon_core import MemorySource, Pipeline, Stage, StagedMixture
from zephon_core.checkpoint.state import parse_lanes
from zephon_core.cli import build_parser
from zephon_core.cli.report import request_of
from zephon_core.metrics import sum_tallies
from zephon_core.report.load import load_run

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from zephon_torchtitan.core import encode_state  # noqa: E402
from zephon_torchtitan.state import DCP_KEY  # noqa: E402


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_report_reads_the_step_folders_of_a_dump_folder(tmp_path):
    a = MemorySource([[1] * (3 + i % 5) for i in range(40)], name="web")
    b = MemorySource([[2] * (2 + i % 3) for i in range(30)], name="code")
    stages = [Stage({"web": 3, "code": 1}, "warmup"), Stage({"web": 1, "code": 1}, "anneal", start_chunk=6)]
    p = Pipeline(StagedMixture([a, b], stages, seed=3, chunk_size=8)).pack(8).batch(2).options(canonical_replicas=4)
    it, states = iter(p), {}
    for step in range(1, 13):
        for _ in range(4):
            next(it)
        if step in (4, 12):
            states[step] = p.checkpoint()
            dcp.save({"model.w": torch.ones(2), DCP_KEY: encode_state(states[step], 1 << 16)},
                     checkpoint_id=str(tmp_path / "checkpoint" / f"step-{step}"), no_dist=True)
    run = load_run(request_of(build_parser().parse_args(["report", str(tmp_path)])))
    assert run.history.steps.tolist() == [4, 12] and run.curriculum.stages == ["warmup", "anneal"]
    assert run.read == "2 checkpoints (step-4 .. step-12)"
    whole = sum_tallies([lane.tally for lane in parse_lanes(states[12]).values()], 2, 2)
    assert run.history.tokens[-1].tolist() == whole.tokens and run.history.documents[-1].tolist() == whole.documents
    assert run.curriculum.sizes == [40, 30] and sum(run.lanes_in_stage) == 4
