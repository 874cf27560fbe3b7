"""--zephon-log-metrics: Zephon's figures in Megatron's writers, taken on rank 0 and written on the last rank.

One process with writers that record what they are given; then 3 gloo processes (rank 0 takes,
rank 2 writes, rank 1 only joins the relay group's creation); then the ``training_log`` seam.
"""

from __future__ import annotations

import json
from argparse import Namespace
from collections import Counter

import gloo_workers
import pytest

pytest.importorskip("torch")

from zephon_core import MemorySource, Pipeline, StaticMixture  # noqa: E402
from zephon_core.integration.batch_log import read_batch_log  # noqa: E402
from zephon_megatron.batches import BatchFormat  # noqa: E402
from zephon_megatron.iterators import TrainStream  # noqa: E402
from zephon_megatron.metrics import MegatronMetrics  # noqa: E402
from zephon_megatron.schedule import BatchSchedule, StepCounter  # noqa: E402
from zephon_megatron.validate import ZephonMegatronError  # noqa: E402

MBS, PER_STEP = 2, 4


def _stream() -> TrainStream:
    docs = [[10 + d % 50] * (2 + d % 5) + [1] for d in range(300)]
    mixture = StaticMixture([MemorySource(docs, name="m")], seed=5, chunk_size=4)
    p = Pipeline(mixture).pack(8).batch(MBS).options(canonical_replicas=4)
    counter = StepCounter(BatchSchedule.constant(PER_STEP * MBS, MBS), 1, iteration=0, consumed_samples=0)
    return TrainStream(p, BatchFormat(eod_id=1), counter, saves=True)


class TensorBoard:
    def __init__(self) -> None:
        self.scalars: dict[str, dict[int, float]] = {}

    def add_scalar(self, tag, value, step):
        self.scalars.setdefault(tag, {})[step] = value


class WandB:
    def __init__(self) -> None:
        self.logged: list[tuple[dict, int]] = []

    def log(self, data, step):
        self.logged.append((dict(data), step))


def _tokens_of_first(path, n: int) -> int:
    return sum((Counter(b.tokens) for b in list(read_batch_log(path))[:n]), Counter())[0]


def test_every_log_interval_the_writers_get_the_figures_of_the_iteration(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_BATCH_LOG", str(tmp_path / "batches-{rank}.log"))
    stream = _stream()
    reader = stream.reader()
    tb, wandb, lines = TensorBoard(), WandB(), []
    m = MegatronMetrics(stream, rank=0, world_size=1, log_interval=2, writers=lambda: (tb, wandb), emit=lines.append)
    for iteration in range(1, 5):
        for _ in range(PER_STEP):
            next(reader)
        m.at_iteration(iteration)
    assert tb.scalars["zephon/tokens/m"] == {2: _tokens_of_first(tmp_path / "batches-0.log", 8),
                                             4: _tokens_of_first(tmp_path / "batches-0.log", 16)}
    assert tb.scalars["zephon/batches"] == {2: 8, 4: 16}
    assert [step for _, step in wandb.logged] == [2, 4]
    assert wandb.logged[1][0] == {k: v[4] for k, v in tb.scalars.items()}
    assert len(lines) == 2 and lines[1].startswith("zephon: stage 0") and lines[1].endswith("| iteration 4")
    stream.save_state()  # a checkpoint: the run-wide figures follow it
    m.at_iteration(6)
    assert tb.scalars["zephon/run/tokens/m"] == {6: tb.scalars["zephon/tokens/m"][4]}


def test_rank_zero_without_a_pipeline_is_refused():
    with pytest.raises(ZephonMegatronError, match="global rank 0 holds no Zephon Pipeline"):
        MegatronMetrics(None, rank=0, world_size=4, log_interval=1)


def _worker(rank: int, out: str) -> None:
    import os

    os.environ["ZEPHON_BATCH_LOG"] = f"{out}.batches-{{rank}}.log"
    stream = _stream() if rank == 0 else None
    reader = stream.reader() if stream is not None else None
    tb = TensorBoard()
    m = MegatronMetrics.set_up(Namespace(log_interval=1), stream)
    if m is not None:
        m._writers = lambda: (tb, None)
        m._emit = lambda line: None
    for iteration in (1, 2):
        if reader is not None:
            for _ in range(PER_STEP):
                next(reader)
        if m is not None:
            m.at_iteration(iteration)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"part": m is not None, "scalars": tb.scalars}, f)


def test_rank_zero_takes_the_figures_and_the_last_rank_writes_them(tmp_path):
    out = gloo_workers.run(_worker, 3, tmp_path)
    got = {r: json.loads(open(f"{out}.{r}").read()) for r in range(3)}
    assert [got[r]["part"] for r in range(3)] == [True, False, True]
    assert got[0]["scalars"] == {} and got[1]["scalars"] == {}
    tokens = got[2]["scalars"]["zephon/tokens/m"]
    log = f"{out}.batches-0.log"
    assert tokens == {"1": _tokens_of_first(log, PER_STEP), "2": _tokens_of_first(log, 2 * PER_STEP)}


def test_training_log_is_followed_by_the_figures_of_its_iteration(monkeypatch):
    from zephon_megatron import loader, plugin

    def training_log(loss_dict, total_loss_dict, learning_rate, iteration, loss_scale, report_memory_flag=True):
        return "report"

    wrapped = plugin.wrap_training_log(training_log)
    assert plugin.wrap_training_log(wrapped) is wrapped
    seen = []
    monkeypatch.setattr(loader, "current_metrics", lambda: Namespace(at_iteration=seen.append))
    assert wrapped({}, {}, 1e-3, 7, 1.0) == "report"
    assert wrapped({}, {}, 1e-3, loss_scale=1.0, iteration=8) == "report"
    monkeypatch.setattr(loader, "current_metrics", lambda: None)  # the option off, or a rank with no part
    assert wrapped({}, {}, 1e-3, 9, 1.0) == "report"
    assert seen == [7, 8]
