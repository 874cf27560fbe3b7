"""``zephon report``: what a run delivered per stage and source against its plan (``zephon_core.report``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from zephon_core.cli.options import add_shape_options, shape_of
from zephon_core.report.load import ReportRequest, load_run, require_matplotlib, run_figures


def request_of(a: argparse.Namespace) -> ReportRequest:
    """The command line's arguments as the plain values ``load_run`` takes."""
    return ReportRequest(tuple(a.inputs), a.recipe, a.canonical_replicas, a.batches_per_step, shape_of(a), a.journal)


def run(a: argparse.Namespace) -> int:
    from zephon_core.report.text import as_html, as_text

    if a.plot or a.html:
        require_matplotlib()  # before the table: a missing extra fails before any output
    r = load_run(request_of(a))
    print(as_text(r))
    title = f"run: {r.read}"
    if a.plot:
        from zephon_core.report.plots import write_png

        write_png(run_figures(r, title)[0], a.plot)
        print(f"wrote {a.plot}")
    if a.html:
        from zephon_core.report.plots import png_base64

        # The page's heading is the title; its pictures go without one.
        Path(a.html).write_text(as_html(r, title, [png_base64(f) for f in run_figures(r, "")]), encoding="utf-8")
        print(f"wrote {a.html}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "report", help="what a run delivered per stage and source against its plan (from checkpoints or audit logs)"
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="PATH",
        help="checkpoints (a state's .json, a DCP folder, a Megatron loader state, "
        "a folder of step-N / iter_N checkpoints) or batch audit logs (files, or a folder of *.log)",
    )
    p.add_argument(
        "--recipe",
        help="the run's recipe: the sources' sizes (epochs) a checkpoint does not record; for audit logs "
        "also the names, the plan and the rows' shape (padding)",
    )
    p.add_argument("--canonical-replicas", type=int, help="audit logs without --recipe: default the lanes seen")
    p.add_argument(
        "--batches-per-step", type=int, help="the run's batches per global step (default: canonical_replicas)"
    )
    p.add_argument("--journal", metavar="STATE", help="audit logs of a steered run or one that had surgery: a "
                   "checkpoint of it, whose mixing journal the logs' stages follow (docs/mixing.md) and whose skips "
                   "and quarantines are noted; a checkpoint input holds its own")
    p.add_argument("--plot", metavar="PNG", help="draw the run (needs the plot extra: matplotlib); a steered run: "
                   "each source's weight against its realized share, and the losses decided on")
    p.add_argument("--html", metavar="HTML", help="write one self-contained page with the table and the picture")
    add_shape_options(p)
    p.set_defaults(fn=run)
