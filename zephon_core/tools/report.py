"""``zephon report``: what a run delivered, per stage and source, against what its recipe asked for.

From checkpoints (the lanes' tallies) or batch audit logs (``tools.report_inputs``
tells them apart), the table of ``report_text`` and, with ``--plot`` / ``--html``,
the pictures of ``plots``: the run over its steps, or per stage for a single
checkpoint. ``--recipe`` adds what the input does not record: the sources' sizes
(for epochs) where a state's definition has none, and for audit logs the names,
the plan and the rows' shape (for padding). ``zephon explain --plot`` draws the
plan the same way (``plot_plan``).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zephon_core.checkpoint.merge import diff_definitions
from zephon_core.checkpoint.state import parse_lanes
from zephon_core.tools.errors import CliError
from zephon_core.tools.report_inputs import STEP_NAME, classify, read_logs, read_state, row_shape
from zephon_core.tools.run_history import (
    Curriculum,
    Run,
    curriculum_of,
    curriculum_of_definition,
    history_of_batches,
    history_of_states,
    short_steps,
    stage_entries,
    unique_batches,
)
from zephon_core.tools.shape import add_shape_options, build, shape_of


def _recipe_pipeline(
    a: argparse.Namespace, definition: Mapping[str, Any] | None, canonical_replicas: int | None
) -> Any:
    """The pipeline ``--recipe`` defines, shaped as the run was (by the checkpoint's definition where there is one)."""
    from zephon_core.recipe import load_recipe

    options: dict[str, Any] = {"prefetch": 0}
    if canonical_replicas is not None:
        options["canonical_replicas"] = canonical_replicas
    return build(load_recipe(a.recipe), shape_of(a, definition), **options)


def _with_recipe_sizes(c: Curriculum, a: argparse.Namespace, state: Mapping[str, Any]) -> Curriculum:
    """The checkpoint's curriculum, with the sizes its definition lacks counted by ``--recipe``.

    The recipe must read the same sources as the run (their fingerprints are compared).
    """
    p = _recipe_pipeline(a, state["definition"], state["canonical_replicas"])
    ours, theirs = state["definition"].get("work_source", {}).get("sources"), p.definition()["work_source"]["sources"]
    diffs = diff_definitions(ours, theirs, "sources")
    if diffs:
        raise CliError(f"{a.recipe}: its sources are not those of the checkpoint ({diffs[0]}); pass the run's recipe")
    sizes: list[int | None] = [size if size else len(src) for size, src in zip(c.sizes, p.work_source.sources)]
    where = a.recipe if any(not size for size in c.sizes) else c.sizes_from
    return Curriculum(c.sources, c.stages, c.shares, sizes, where, c.stage_starts)


def _label(path: str) -> str:
    """A checkpoint as a series names it: its step-N / iter_N folder (a Megatron file sits deeper), else its file name."""
    return next((part for part in reversed(Path(path).parts) if STEP_NAME.fullmatch(part)), Path(path).name)


def _run_of_checkpoints(paths: list[tuple[int | None, str]], a: argparse.Namespace) -> Run:
    read = [(step, path, read_state(path)) for step, path in paths]
    last = read[-1][2]
    C = last["canonical_replicas"]
    B = a.batches_per_step or C
    # A checkpoint's step: from its name (step-N, iter_N), else from the batches its lanes delivered.
    dated = sorted(
        ((step if step is not None else sum(ls.delivered for ls in parse_lanes(s).values()) // B), path, s)
        for step, path, s in read
    )
    state = dated[-1][2]
    c = curriculum_of_definition(state["definition"])
    if a.recipe:
        c = _with_recipe_sizes(c, a, state)
    history, notes = history_of_states([(step, s) for step, _, s in dated], len(c.stages), len(c.sources))
    c = c.widened(*history.shape)
    lanes = parse_lanes(state)
    in_stage = [0] * len(c.stages)
    for lane, ls in lanes.items():
        in_stage[c.stage_of_chunk(lane + ls.cursor.last_chunk * C)] += 1
    missing = C - len(lanes)
    if missing:
        notes.append(
            f"the latest checkpoint holds {len(lanes)} of {C} lanes (a per-group state): "
            "the figures are those lanes' only"
        )
    what = (
        f"{len(dated)} checkpoints ({_label(dated[0][1])} .. {_label(dated[-1][1])})"
        if len(dated) > 1
        else f"checkpoint {dated[0][1]}"
    )
    return Run(c, history, what, in_stage, len(lanes), C, notes)


def _run_of_logs(logs: list[str], a: argparse.Namespace) -> Run:
    batches = unique_batches(read_logs(logs))
    if not batches:
        raise CliError(f"{logs[0]}: the audit logs hold no batch")
    shape = None
    if a.recipe:
        p = _recipe_pipeline(a, None, a.canonical_replicas)
        c, C = curriculum_of(p.work_source, a.recipe), p.identity.canonical_replicas
        shape = row_shape(p.definition())
    else:
        c, C = Curriculum([], []), a.canonical_replicas or 1 + max(lane for lane, _ in batches)
    B = a.batches_per_step or C
    if B % C:
        raise CliError(
            f"--batches-per-step {B} is not a multiple of canonical_replicas {C}: "
            "a step's batches would not be whole per lane"
        )
    history = history_of_batches(batches, B // C, len(c.stages), len(c.sources), shape)
    if a.recipe and history.shape != (len(c.stages), len(c.sources)):
        raise CliError(f"{a.recipe}: {len(c.stages)} stage(s) over {len(c.sources)} source(s), but the logs count "
                       f"{history.shape[0]} over {history.shape[1]}: pass the run's recipe")
    c = c.widened(*history.shape)
    last: dict[int, tuple[int, int]] = {}
    for (lane, index), b in batches.items():
        last[lane] = max(last.get(lane, (-1, 0)), (index, b.stage))
    in_stage = [0] * len(c.stages)
    for _, stage in last.values():
        in_stage[stage] += 1
    notes = [] if a.recipe else ["no --recipe: sources and stages are numbered, their plan and sizes are not known"]
    short = short_steps(history, B)
    if short:
        notes.append(
            f"{len(short)} step(s) hold fewer than {B} batches (first: step {short[0]}): are all ranks' logs here, "
            "and is --batches-per-step right?"
        )
    what = (
        f"{len(logs)} audit logs ({Path(logs[0]).name} .. {Path(logs[-1]).name})"
        if len(logs) > 1
        else f"audit log {logs[0]}"
    )
    return Run(c, history, what, in_stage, len(last), C, notes, stage_entries(batches, B // C, len(c.stages)))


def load_run(a: argparse.Namespace) -> Run:
    """The run the command line names (``a.inputs``), with what ``--recipe`` adds."""
    inputs = classify(a.inputs)
    return _run_of_logs(inputs.logs, a) if inputs.logs else _run_of_checkpoints(inputs.checkpoints, a)


def run_figure(run: Run, title: str) -> Any:
    """The picture of a run: over its steps, or per stage for a single checkpoint (no history)."""
    from zephon_core.tools.figures import run_picture, stage_bars
    from zephon_core.tools.plots import draw_picture, draw_stage_bars

    if run.history.every_step or len(run.history.steps) > 1:
        return draw_picture(run_picture(run, title))
    return draw_stage_bars(stage_bars(run, title))


def cmd_report(a: argparse.Namespace) -> int:
    from zephon_core.tools.report_text import as_html, as_text

    run = load_run(a)
    print(as_text(run))
    title = f"run: {run.read}"
    fig = run_figure(run, title) if a.plot or a.html else None
    if a.plot:
        from zephon_core.tools.plots import write_png

        write_png(fig, a.plot)
        print(f"wrote {a.plot}")
    if a.html:
        from zephon_core.tools.plots import png_base64

        Path(a.html).write_text(as_html(run, title, [png_base64(fig)]), encoding="utf-8")
        print(f"wrote {a.html}")
    return 0


def tokens_per_step(p: Any, global_batch_size: int | None, batches_per_step: int) -> int | None:
    """Tokens a global step trains on: ``global_batch_size`` rows (else ``batches_per_step`` batches) of seq_len + 1."""
    shape = row_shape(p.definition())
    if shape is None:
        return None
    return (global_batch_size or batches_per_step * shape[0]) * shape[1]


def plot_plan(p: Any, recipe: Any, a: argparse.Namespace) -> None:
    """``zephon explain --plot``: the planned schedule of ``p``'s work source, drawn as ``zephon report`` draws runs."""
    from zephon_core.tools.plan_figures import chunk_at_step, plan_picture
    from zephon_core.tools.plots import draw_picture, write_png

    per_step = tokens_per_step(p, recipe.spec.global_batch_size, a.batches_per_step or p.identity.canonical_replicas)
    span = None
    if a.plot_steps:
        span = chunk_at_step(p.work_source, a.plot_steps, per_step) or a.plot_steps
    write_png(
        draw_picture(plan_picture(p.work_source, f"plan: {a.recipe}", tokens_per_step=per_step, span=span)), a.plot
    )
    print(f"wrote {a.plot}")


def add_plan_plot_options(p: argparse.ArgumentParser) -> None:
    """``zephon explain``'s ``--plot`` and what it needs (``plot_plan``)."""
    p.add_argument("--plot", metavar="PNG", help="draw the planned schedule: shares and epochs per source over "
                   "global steps (needs the plot extra: matplotlib)")
    p.add_argument("--plot-steps", type=int, metavar="N", help="draw the plan up to global step N (chunk N where "
                   "the plan has no steps); default: a quarter past the last stage's start")
    p.add_argument("--batches-per-step", type=int, help="for --plot without global_batch_size: batches per global step "
                   "(default: canonical_replicas)")


def add_report_parser(sub: Any) -> None:
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
    p.add_argument("--plot", metavar="PNG", help="draw the run (needs the plot extra: matplotlib)")
    p.add_argument("--html", metavar="HTML", help="write one self-contained page with the table and the picture")
    add_shape_options(p)
    p.set_defaults(fn=cmd_report)
