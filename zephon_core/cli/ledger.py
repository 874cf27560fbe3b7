"""``zephon ledger``: what a run trained on, step -> documents and document -> steps, from its checkpoint."""

from __future__ import annotations

import argparse
import glob
from typing import Any

from zephon_core.cli.options import add_shape_options, load, pipeline
from zephon_core.errors import CliError
from zephon_core.integration.batch_log import read_batch_log
from zephon_core.integration.state_readers import load_checked_state


def run(a: argparse.Namespace) -> int:
    from zephon_core.verify.ledger import build_ledger

    recipe = load(a.recipe)
    state = load_checked_state(a.state)
    C = int(state["canonical_replicas"])
    B = a.batches_per_step or C
    ledger = build_ledger(lambda: pipeline(recipe, a, dp_degree=1, dp_group_id=0, canonical_replicas=C, prefetch=0),
                          state, B, a.dp_degree)
    steps = int(ledger.columns["step"].max()) if len(ledger) else 0
    print(f"{a.state}: {len(ledger.digests)} batches, {steps} steps, {len(ledger)} rows, "
          f"{len(ledger.hashes)} documents")
    if a.step is not None:
        print(f"step {a.step}: lane batch rank row  source#document[start:stop] hash")
        for lane, index, rank, row, source, doc, start, stop, h in ledger.rows_of(a.step):
            print(f"  {lane} {index} {rank} {row}  {source}#{doc}[{start}:{stop}] {h}")
    for s, d in (key for name in a.document or () for key in ledger.documents_of(name)):
        found = ledger.steps_of(s, d)
        print(f"{ledger.sources[s]}#{d} ({ledger.hashes.get((s, d), 'not trained on')}): "
              f"steps {', '.join(map(str, found)) or 'none'}")
    if a.parquet:
        ledger.write_parquet(a.parquet)
        print(f"wrote {a.parquet}")
    if a.logs:
        paths = sorted(p for pattern in a.logs for p in glob.glob(pattern))
        if not paths:
            raise CliError(f"--logs {' '.join(a.logs)}: no such file")
        problems = ledger.check_logs((b.lane, b.lane_index, b.digest) for p in paths for b in read_batch_log(p))
        for problem in problems:
            print(f"  LOG: {problem}")
        print(f"batch logs ({len(paths)} files): " + ("differ" if problems else "every batch agrees"))
        return 1 if problems else 0
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("ledger", help="which documents each step trained on, and which steps trained on a document")
    p.add_argument("recipe")
    p.add_argument("--state", required=True, help="the run's checkpoint state (the ledger covers the steps before it)")
    p.add_argument("--batches-per-step", type=int, help="default: canonical_replicas")
    p.add_argument("--dp-degree", type=int, help="the run's data-parallel degree, for the rank column "
                                                 "(default: the state's)")
    p.add_argument("--step", type=int, help="print the rows of this global step (from 1)")
    p.add_argument("--document", action="append", help="SOURCE#N or a content hash: print the steps that trained "
                                                       "on it (repeatable)")
    p.add_argument("--logs", nargs="+", help="batch audit logs (globs) to compare with, batch by batch")
    p.add_argument("--parquet", help="write the whole ledger to this Parquet file")
    add_shape_options(p)
    p.set_defaults(fn=run)
