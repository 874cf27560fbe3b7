"""Run a test's worker function on N spawned processes that form a gloo group (file rendezvous, no ports)."""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from collections.abc import Callable
from pathlib import Path


def _guarded(target: Callable[..., None], rank: int, world: int, store: str, out: str) -> None:
    try:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
        target(rank, out)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        with open(f"{out}.{rank}.err", "w") as f:
            f.write(traceback.format_exc())
        raise


def run(target: Callable[[int, str], None], world: int, tmp: Path, timeout: float = 300) -> str:
    """``target(rank, out)`` on ``world`` processes; returns ``out``, the prefix of the files they wrote.

    A worker's traceback (``out.RANK.err``) fails the caller with its text.
    """
    out = str(tmp / "res")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_guarded, args=(target, r, world, str(tmp / "store"), out)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    errs = [(tmp / f).read_text() for f in os.listdir(tmp) if f.endswith(".err")]
    assert not errs, "\n".join(errs)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return out
