"""``zephon ledger``: what a run trained on, step -> documents and document -> steps, from its checkpoint and, when
their lines say each batch's rows, its batch audit logs alone (no replay; documents read raw, and only for the
content hashes asked for)."""

from __future__ import annotations

import argparse
import glob
from typing import Any

from zephon_core.cli.options import add_shape_options, load, pipeline
from zephon_core.errors import CliError
from zephon_core.integration.state_readers import load_checked_state


def _build(a: argparse.Namespace, recipe: Any, state: Any, B: int, logged: list[Any]) -> Any:
    """From the logs when they carry rows (and ``--replay`` is not given), else by replay."""
    from zephon_core.verify.ledger import build_ledger
    from zephon_core.verify.ledger_logs import carry_rows, ledger_from_logs

    if logged and not a.replay and carry_rows(logged):
        return ledger_from_logs(logged, state, B, recipe.sources(), a.dp_degree)
    C = int(state["canonical_replicas"])
    return build_ledger(lambda: pipeline(recipe, a, dp_degree=1, dp_group_id=0, canonical_replicas=C, prefetch=0),
                        state, B, a.dp_degree, where=a.state)


def run(a: argparse.Namespace) -> int:
    from zephon_core.integration.batch_log import run_fingerprint
    from zephon_core.verify.log_timelines import read_run_logs

    recipe = load(a.recipe)
    state = load_checked_state(a.state)
    paths = sorted(p for pattern in a.logs or () for p in glob.glob(pattern))
    if a.logs and not paths:
        raise CliError(f"--logs {' '.join(a.logs)}: no such file")
    logs = read_run_logs(paths, run_fingerprint(state["definition"]))
    logged = logs.logged
    ledger = _build(a, recipe, state, a.batches_per_step or int(state["canonical_replicas"]), logged)
    steps = int(ledger.columns["step"].max()) if len(ledger) else 0
    how = (f"from the batch audit logs ({len(paths)} files; no replay)" if ledger.built == "logs" else
           "by replay (the corpus read and tokenized again)")
    print(f"{a.state}: {len(ledger.digests)} batches, {steps} steps, {len(ledger)} rows, "
          f"{len(ledger.documents())} documents; built {how}")
    if a.step is not None:
        if not 1 <= a.step <= steps:
            raise CliError(f"--step {a.step}: the ledger of {a.state} has steps 1..{steps}; give one of them")
        print(f"step {a.step}: lane batch rank row  source#document[start:stop] hash")
        for lane, index, rank, row, source, doc, start, stop, h in ledger.rows_of(a.step):
            print(f"  {lane} {index} {rank} {row}  {source}#{doc}[{start}:{stop}] {h}")
    for s, d in (key for name in a.document or () for key in ledger.documents_of(name)):
        found = ledger.steps_of(s, d)
        print(f"{ledger.sources[s]}#{d} ({ledger.hash_of(s, d) if found else 'not trained on'}): "
              f"steps {', '.join(map(str, found)) or 'none'}")
    if a.parquet:
        ledger.write_parquet(a.parquet)
        print(f"wrote {a.parquet}")
    if not logged:
        return 0
    if logs.abandoned:
        print(f"  rolled back: {sum(logs.abandoned.values())} logged batch(es) of launch(es) "
              f"{', '.join(sorted(logs.abandoned))} were trained again by a later launch with other content; the "
              "later launch's are the run's")
    if ledger.extras:
        print(f"  {len(ledger.extras)} logged batch(es) are not the state's (trained after it was taken, or in a "
              f"skipped step), first {ledger.extras[0]}")
    if ledger.built == "logs":  # nothing was compared with a replay: say what was checked
        print(f"batch logs ({len(paths)} files): the ledger built from them; {logs.checked()}; batches logged "
              "by several ranks agree")
        return 0
    problems = ledger.check_logs(logged)
    for problem in problems:
        print(f"  LOG: {problem}")
    print(f"batch logs ({len(paths)} files): " + ("differ" if problems else "every batch agrees with the replay"))
    return 1 if problems else 0


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
    p.add_argument("--logs", nargs="+", help="the run's batch audit logs (globs): the ledger is built from them when "
                                             "their lines say each batch's rows, and they are checked batch by batch")
    p.add_argument("--replay", action="store_true",
                   help="build by replay (reading and tokenizing the corpus again) even when the logs say the rows, "
                        "and compare the logs with it")
    p.add_argument("--parquet", help="write the whole ledger to this Parquet file")
    add_shape_options(p)
    p.set_defaults(fn=run)
