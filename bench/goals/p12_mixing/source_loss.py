"""What the per-source training loss costs per training step (issue #34), against a CPU training step.

    $ZEPHON_PY bench/goals/p12_mixing/source_loss.py [--repeats N] [--no-launch] [--out FILE.json]

The step is the e2e test's (tests/e2e/test_source_loss_e2e.py): TorchTitan 0.3's llama3 debug model at
dp=2 on CPU, 8 rows of 128 tokens per step (2 batches of 2 rows per rank), ``ChunkedLossWrapper`` with 8
chunks, over three sources (``runs.mixed_recipe``). Per rank and step, ``source_loss`` adds:

* ``label_sources`` of each of its 2 batches (the loader side);
* ``SourceLossTally.begin`` for each of its 2 micro-batches (one label comparison) and ``add`` for each
  of the 16 loss calls (8 chunks x 2 batches): the per-token cross entropy again, without gradient, on
  the chunk's logits, and two ``index_add_`` into the table;
* one ``all_reduce`` of the ``[2, 3]`` table over a 2-process gloo group, and the ``SourceLoss`` made
  from it (timed in 2 spawned processes).

Each part is timed here on the real objects, ``--repeats`` times (the median); the step itself is
TorchTitan's own figure from one launch with ``source_loss`` on (``tps``: tokens per second per rank,
so a step is 512 / tps seconds; the median over steps 2..N). ``--no-launch`` skips it. Prints one
``RESULT {json}`` line: microseconds per part and per step, and their share of the step.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from measure import emit  # the Runner (bench/harness.py) puts bench/ and scripts/ on PYTHONPATH

ROOT = Path(__file__).resolve().parents[3]


BATCHES_PER_STEP, CHUNKS, ROWS, SEQ = 2, 8, 2, 128
STEPS = 6


def _median_us(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def _reduce_worker(rank: int, port: int, repeats: int, out: dict) -> None:
    from zephon_core.integration import source_loss_of

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    table = torch.rand(2, 3, dtype=torch.float64)

    def once() -> None:
        t = table.clone()
        dist.all_reduce(t)
        source_loss_of(1, ("examples", "reference", "prose"), t.tolist())

    for _ in range(20):
        once()
    us = _median_us(once, repeats)
    dist.destroy_process_group()
    if rank == 0:
        out["reduce_us"] = us


def parts(repeats: int) -> dict[str, float]:
    """Microseconds of each part of one step's overhead on one rank (see the module docstring)."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan_cpu.runs import ASSETS, mixed_recipe

    import zephon_torchtitan as zt
    from zephon_core.integration import label_sources
    from zephon_torchtitan.source_loss import SourceLossTally

    with tempfile.TemporaryDirectory() as tmp:
        tok = HuggingFaceTokenizer(tokenizer_path=str(ASSETS))
        loader = zt.ZephonDataLoader.Config(recipe=str(mixed_recipe(Path(tmp))), global_batch_size=8).build(
            dp_world_size=2, dp_rank=0, tokenizer=tok, seq_len=SEQ, local_batch_size=ROWS)
        it = iter(loader.pipeline)
        batches = [next(it) for _ in range(BATCHES_PER_STEP)]
    ids_us = _median_us(lambda: [label_sources(b) for b in batches], repeats)

    vocab = tok.get_vocab_size()
    tally = SourceLossTally(("examples", "reference", "prose"))
    labels = torch.from_numpy(batches[0].labels)
    logits = torch.randn(ROWS, SEQ // CHUNKS, vocab)

    def add_one_batch() -> None:
        tally.delivered(batches[0])
        tally.begin(labels.clone())  # a micro-batch of its own (a clone: not the previous one's labels again)
        for c in range(CHUNKS):
            tally.add(logits, labels[:, c * SEQ // CHUNKS:(c + 1) * SEQ // CHUNKS])

    # delivered() (label_sources again) is inside add_one_batch: its own median is taken off below.
    one_ids = _median_us(lambda: label_sources(batches[0]), repeats)
    add_us = BATCHES_PER_STEP * (_median_us(add_one_batch, repeats) - one_ids)

    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_reduce_worker, args=(29500 + os.getpid() % 1000, repeats, out), nprocs=2, join=True)
    return {"label_sources_us": ids_us, "loss_add_us": add_us, "reduce_us": float(out["reduce_us"])}


def step_seconds() -> float:
    """TorchTitan's own step time (median over steps 2..STEPS) of the e2e run with source_loss on."""
    from torchtitan_cpu.runs import launch, mixed_recipe

    with tempfile.TemporaryDirectory() as tmp:
        r = launch("0.3", 2, Path(tmp) / "run", steps=STEPS, metrics=True, source_loss=True,
                   loader={"recipe": str(mixed_recipe(Path(tmp)))})
        tps = [float(x.replace(",", "")) for x in re.findall(r"tps: ([0-9,]+)", r.log_text())]
    tokens = BATCHES_PER_STEP * ROWS * SEQ
    return statistics.median(tokens / t for t in tps[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--no-launch", action="store_true", help="time the parts only, not TorchTitan's step")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)  # as each rank of the launch runs (torchrun sets OMP_NUM_THREADS=1)
    res: dict[str, float | None] = dict(parts(a.repeats))
    res["per_step_us"] = res["label_sources_us"] + res["loss_add_us"] + res["reduce_us"]  # type: ignore[operator]
    step = None if a.no_launch else step_seconds()
    res["step_ms"] = None if step is None else step * 1e3
    res["share_of_step"] = None if step is None else res["per_step_us"] / (step * 1e6)  # type: ignore[operator]
    emit(res, a.out)


if __name__ == "__main__":
    main()
