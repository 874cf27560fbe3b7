"""Zephon benchmarks, side by side with peer loaders: ``bash bench/run.sh`` (which runs this).

A small orchestrator. Every measurement runs as a subprocess (``bench/cases.py CASE JSON``, or a standalone
script) of the interpreter that holds the loader under test (bench/harness.py's ``Runner``), on one corpus and
one tokenizer. What is measured, its targets and its part of the report belong to the goals in bench/goals
(the loaders under test: bench/loaders). This driver

* builds the corpus (cached under bench/.work) and checks that zephon_core yields the same batches in every
  execution configuration and the same as the baseline run recorded (bench/determinism.py);
* runs each selected goal (``--only``) and writes
  ``bench/results/results.json`` (every number, the machine, versions, load averages),
  ``bench/results/results.md`` (the tables and verdicts), the headline block of docs/performance.md
  (bench/report.py) and ``docs/img/perf_*.png`` (bench/plot.py, in the peers venv); a run of some goals
  (``--only``) or a ``--quick`` one writes its own to ``bench/results/partial/`` instead (``outputs``).

Options: ``--quick`` (a smoke run: one round, short windows, small rank counts), ``--only P1,P3`` (a subset;
``P4S3``, the 16,384-rank S3 case, runs only when named), ``--rounds N``, ``--baseline FILE|none`` (an earlier
results.json for the "before" columns), ``--report-only`` (rewrite the reports and the plots from results.json),
``--no-determinism``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import determinism
import report
from goals import REGISTRY, targets
from harness import (
    BASELINE,
    BATCH,
    BENCH,
    IMG,
    PARTIAL,
    RESULTS,
    ROOT,
    SEED,
    SEQ_LEN,
    WORK,
    Context,
    Runner,
    log,
    open_log,
)
from machine import machine_info

DEFAULT_ONLY = ",".join(g.key for g in REGISTRY if g.run is not None and g.default)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project-python", default=sys.executable)
    ap.add_argument("--peers-python", default=None)
    ap.add_argument("--quick", action="store_true", help="smoke run: one round, short windows, 2 and 8 ranks")
    ap.add_argument("--only", default=DEFAULT_ONLY, help="goals to measure (default: %(default)s; P4S3 when named)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--s3rver", default=None, help="s3rver's bin/s3rver.js (bench/run.sh installs it): P4's second "
                    "loopback S3 server")
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--baseline", default=str(BASELINE.relative_to(ROOT)),
                    help="an earlier results.json for the 'before' columns (default: %(default)s, if present; "
                    "'none' for no baseline)")
    ap.add_argument("--no-determinism", action="store_true",
                    help="skip the check that every execution configuration yields the same batches")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite results.md, docs/performance.md's headline and the plots from results.json")
    return ap.parse_args(argv)


def outputs(args: argparse.Namespace, only: set[str]) -> Path | None:
    """Where a run that is not the reference run writes its results; None for the reference run.

    The reference run (every default goal, full windows) owns results.json, results.md, the headline block of
    docs/performance.md and the plots, so that a smoke run or a single goal never replaces the figures the docs
    show with a subset. Any other run writes bench/results/partial/<goals>[-quick]/, which git ignores.
    """
    if not args.quick and only >= set(DEFAULT_ONLY.split(",")):
        return None
    return PARTIAL / ("-".join(sorted(only)) + ("-quick" if args.quick else ""))


def write_reports(R: dict, peers_py: str | None, env: dict[str, str] | None = None, folder: Path | None = None) -> None:
    """results.json and results.md from ``R``, then the plots; in ``folder`` for a partial run, else the reference
    outputs and the headline block of docs/performance.md."""
    R["goals"] = report.verdicts(R)
    out, img = (folder, folder) if folder else (RESULTS, IMG)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(R, indent=1, default=str))
    (out / "results.md").write_text(report.markdown(R))
    if folder is None and not report.write_headline(R):
        log(f"  {report.PERFORMANCE_MD.relative_to(ROOT)} has no {report.HEADLINE_START} block: not rewritten")
    if peers_py:
        img.mkdir(parents=True, exist_ok=True)
        p = subprocess.run([peers_py, str(BENCH / "plot.py"), str(out / "results.json"), str(img)], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=120)
        log("plots: " + (p.stdout.strip().replace("\n", ", ") if p.returncode == 0 else "FAILED " + p.stderr[-500:]))


def report_only(args: argparse.Namespace, baseline: dict | None) -> int:
    R = json.loads((RESULTS / "results.json").read_text())
    if baseline is not None or args.baseline == "none":
        R["baseline"] = report.baseline_summary(baseline)
    write_reports(R, args.peers_python)
    return 0


def user_command(args: argparse.Namespace) -> str:
    """The command as a user types it: bench/run.sh's own arguments (interpreters, s3rver) left out."""
    own = {args.project_python, args.peers_python, args.s3rver}
    kept = [a for a in sys.argv[1:] if not a.startswith(("--project-python", "--peers-python", "--s3rver"))
            and a not in own]
    return " ".join(["bash bench/run.sh", *kept])


def prepare(r: Runner, args: argparse.Namespace, R: dict) -> dict | None:
    """The corpus (cached), and the arguments every case starts from; None where it could not be built."""
    log("corpus (cached under bench/.work)")
    prep = r.case("project", "prepare", {"work": str(WORK), "docs": args.docs, "seed": 20261129,
                                         "index_cache": str(WORK / "index")}, timeout=900)
    if "error" in prep:
        log("corpus preparation failed:\n" + prep.get("stderr", ""))
        return None
    R["corpus"] = prep["meta"]
    return {**prep["paths"], "index_cache": str(WORK / "index"), "seed": SEED, "seq_len": SEQ_LEN, "batch": BATCH}


def main() -> int:
    args = parse()
    baseline = None if args.baseline == "none" else report.load_baseline(ROOT / args.baseline)
    if args.report_only:
        return report_only(args, baseline)
    only = {s.strip() for s in args.only.split(",")}
    rounds = args.rounds or (1 if args.quick else 3)
    folder = outputs(args, only)
    (folder or RESULTS).mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    open_log((folder or RESULTS) / "run.log")
    t_start = time.perf_counter()
    r = Runner(args.project_python, args.peers_python)

    log("machine and versions")
    R: dict[str, Any] = {"command": user_command(args), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                         "quick": args.quick, "rounds": rounds, "seq_len": SEQ_LEN, "batch": BATCH,
                         "goals_targets": targets()}
    R["machine"] = machine_info(r)
    log(f"  {R['machine']['nproc']} CPUs, {R['machine']['memory']}, load {R['machine']['loadavg_start']}")
    base = prepare(r, args, R)
    if base is None:
        return 1
    R["baseline"] = report.baseline_summary(baseline)
    if not args.no_determinism:
        R["determinism"] = determinism.check(r, base, baseline)
        log(determinism.summary(R["determinism"]))

    ctx = Context(r, base, quick=args.quick, rounds=rounds, only=only, s3rver=args.s3rver, work=WORK,
                  results=folder or RESULTS)
    for goal in REGISTRY:
        if goal.run is not None and goal.selected(only):
            log(f"{goal.key} {goal.title}")
            R[goal.store] = goal.run(ctx)

    R["loadavg_end"] = os.getloadavg()
    R["wall_s"] = time.perf_counter() - t_start
    write_reports(R, r.py["peers"], r.env("peers"), folder)
    if folder is None:
        log("results: bench/results/results.json, bench/results/results.md, docs/performance.md's headline, plots")
    else:
        log(f"results (a partial run: the reference results are left as they are): {folder.relative_to(ROOT)}/")
    for g in R["goals"]:
        log(f"  {'PASS' if g['pass'] else 'FAIL'}  {g['goal']}: {g['measured']} (target {g['target']})")
    log(f"done in {R['wall_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
