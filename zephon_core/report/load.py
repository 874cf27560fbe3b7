"""A run as ``zephon report`` shows it: what it delivered, per stage and source, against what its recipe asked for.

``load_run(ReportRequest(...))`` takes plain values (the command line translates its arguments once,
``cli/report.py``). From checkpoints (the lanes' tallies) or batch audit logs (``inputs`` tells them
apart), the table of ``text`` and the pictures of ``plots`` (``run_figures``): the run over its steps, or
per stage for a single checkpoint. A recipe adds what the input does not record: the sources' sizes
(for epochs) where a state's definition has none, and for audit logs the names, the plan and the rows'
shape (for padding). ``zephon explain --plot`` draws the plan the same way (``plan_png``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zephon_core.checkpoint.merge import diff_definitions
from zephon_core.checkpoint.state import parse_lanes
from zephon_core.checkpoint.surgery import surgery_journal_of
from zephon_core.curriculum.definition import parse_definition
from zephon_core.curriculum.steered import describe_journal
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.errors import CliError
from zephon_core.report.history import (
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
from zephon_core.report.inputs import STEP_NAME, classify, read_logs, read_state, row_shape
from zephon_core.report.surgery import journal_notes, skipped_figures, without_skipped
from zephon_core.verify.shape import Shape, build, work_source


@dataclass(frozen=True)
class ReportRequest:
    """What to report on: the inputs (checkpoints or audit logs) and what the user said about the run."""

    inputs: tuple[str, ...]
    recipe: str | None = None  # the run's recipe: sizes, names, plan, rows' shape
    canonical_replicas: int | None = None  # audit logs without a recipe: default the lanes seen
    batches_per_step: int | None = None  # default: canonical_replicas
    shape: Shape = field(default_factory=Shape)  # the run's shape, for a training recipe
    journal: str | None = None  # audit logs: a checkpoint of the run, whose mixing journal they follow (and surgery)


def _recipe_plan(a: ReportRequest) -> tuple[WorkSource, int | None, tuple[int, int] | None]:
    """What ``--recipe`` plans for audit logs: its curriculum, its lanes and the rows' shape (None: not known).

    A [standalone] recipe, or one given with ``--framework``, is built as the run built it; a training
    recipe alone gives its curriculum (``verify.shape.work_source`` says when that needs the run's shape)
    and the rows' shape where ``--seq-len`` and ``--batch-size`` are given.
    """
    from zephon_core.recipe import load_recipe

    assert a.recipe is not None
    recipe = load_recipe(a.recipe)
    if recipe.spec.standalone is not None or a.shape.framework is not None:
        options: dict[str, Any] = {"prefetch": 0}
        if a.canonical_replicas is not None:
            options["canonical_replicas"] = a.canonical_replicas
        p = build(recipe, a.shape, **options)
        return p.work_source, p.identity.canonical_replicas, row_shape(p.definition())
    rows = None if a.shape.seq_len is None or a.shape.batch_size is None else (a.shape.batch_size, a.shape.seq_len + 1)
    return work_source(recipe, a.shape), a.canonical_replicas or recipe.spec.canonical_replicas, rows


def _with_recipe_sizes(c: Curriculum, a: ReportRequest, state: Mapping[str, Any]) -> Curriculum:
    """The checkpoint's curriculum, with the sizes its definition lacks counted from ``--recipe``'s sources.

    The recipe must read the same sources as the run (their fingerprints are compared); nothing else of it
    is needed, so a training recipe needs no run's shape here.
    """
    from zephon_core.recipe import load_recipe

    assert a.recipe is not None
    sources = load_recipe(a.recipe).sources()
    ws = parse_definition(state["definition"]).work_source
    ours = [s.definition(weight=False) for s in ws.sources] if ws is not None else None
    theirs = [{"name": s.name, **s.fingerprint()} for s in sources]
    diffs = diff_definitions(ours, theirs, "sources")
    if diffs:
        raise CliError(f"{a.recipe}: its sources are not those of the checkpoint ({diffs[0]}); pass the run's recipe")
    sizes: list[int | None] = [size if size else len(src) for size, src in zip(c.sizes, sources)]
    where = (a.recipe or "") if any(not size for size in c.sizes) else c.sizes_from
    return Curriculum(c.sources, c.stages, c.shares, sizes, where, c.stage_starts)


def _run_pipeline(a: ReportRequest, state: Mapping[str, Any], path: str) -> Any:
    """The run's pipeline on one group, every lane (its mixing journal replayed), from ``--recipe``; None where the
    recipe is not given or cannot be built without the run's shape (a training recipe without ``--framework``)."""
    if not a.recipe:
        return None
    from zephon_core.pipeline.mixing import with_history
    from zephon_core.recipe import load_recipe

    recipe = load_recipe(a.recipe)
    if recipe.spec.standalone is None and a.shape.framework is None:
        return None
    p = build(recipe, a.shape, prefetch=0, canonical_replicas=state["canonical_replicas"])
    return with_history(p, state, where=path)


def _label(path: str) -> str:
    """A checkpoint as a series names it: its step-N / iter_N folder (a Megatron file sits deeper), else its file
    name."""
    return next((part for part in reversed(Path(path).parts) if STEP_NAME.fullmatch(part)), Path(path).name)


def _run_of_checkpoints(paths: list[tuple[int | None, str]], a: ReportRequest) -> Run:
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
    surgery = surgery_journal_of(state)
    p = _run_pipeline(a, state, dated[-1][1]) if surgery.skips else None
    if p is not None:
        delivered = [{lane: ls.delivered for lane, ls in parse_lanes(s).items()} for _, _, s in dated]
        history = without_skipped(history, skipped_figures(p, surgery, delivered))
    notes.extend(journal_notes(surgery, left_out=p is not None))
    lanes = parse_lanes(state)
    in_stage = [0] * len(c.stages)
    for lane, ls in lanes.items():
        in_stage[c.stage_of_chunk(lane + ls.cursor.last_chunk * C)] += 1
    journal = parse_definition(state["definition"]).journal
    if journal is not None:
        notes.extend(describe_journal(journal, most=10))
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
    return Run(c, history, what, in_stage, len(lanes), C, notes, journal=journal)


def _logs_plan(a: ReportRequest, steered: Mapping[str, Any] | None
               ) -> tuple[Curriculum, int | None, tuple[int, int] | None]:
    """The curriculum, lanes (None: count the logs') and rows' shape that audit logs are read against: the recipe's
    with the journal of ``steered`` replayed, the recipe's, the steered state's own definition, or none."""
    if a.recipe and steered is not None:
        from zephon_core.pipeline.mixing import with_history
        from zephon_core.recipe import load_recipe

        options: dict[str, Any] = {"prefetch": 0}
        if a.canonical_replicas is not None:
            options["canonical_replicas"] = a.canonical_replicas
        p = with_history(build(load_recipe(a.recipe), a.shape, **options), steered, where=str(a.journal))
        return curriculum_of(p.work_source, a.recipe), p.identity.canonical_replicas, row_shape(p.definition())
    if a.recipe:
        ws, C, shape = _recipe_plan(a)
        return curriculum_of(ws, a.recipe), C, shape
    if steered is not None:
        return curriculum_of_definition(steered["definition"]), steered["canonical_replicas"], None
    return Curriculum([], []), a.canonical_replicas, None


def _run_of_logs(logs: list[str], a: ReportRequest) -> Run:
    batches = unique_batches(read_logs(logs))
    if not batches:
        raise CliError(f"{logs[0]}: the audit logs hold no batch")
    steered = read_state(a.journal) if a.journal else None
    c, C, shape = _logs_plan(a, steered)
    C = C or 1 + max(lane for lane, _ in batches)
    journal, surgery = None, None
    if steered is not None:
        journal, surgery = parse_definition(steered["definition"]).journal, surgery_journal_of(steered)
        if journal is None and not surgery:
            raise CliError(f"--journal {a.journal}: the checkpoint holds no mixing journal (not a steered run) "
                           "and no surgery journal")
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
    notes = [] if a.recipe or steered else ["no --recipe: sources and stages are numbered, their plan and sizes are "
                                            "not known"]
    if journal is not None:
        notes.extend(describe_journal(journal, most=10))
    if surgery:
        notes.extend(journal_notes(surgery, left_out=True))  # no rank logs a batch it skipped
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
    return Run(c, history, what, in_stage, len(last), C, notes, stage_entries(batches, B // C, len(c.stages)),
               journal)


def load_run(a: ReportRequest) -> Run:
    """The run ``a.inputs`` hold, with what ``a.recipe`` adds."""
    inputs = classify(a.inputs)
    if a.journal and not inputs.logs:
        raise CliError("--journal is for audit logs: a checkpoint holds its own mixing journal; drop --journal")
    return _run_of_logs(inputs.logs, a) if inputs.logs else _run_of_checkpoints(inputs.checkpoints, a)


def require_matplotlib() -> None:
    """Fail now, in one line naming the plot extra (``cli.errors``), when matplotlib is missing."""
    import matplotlib  # noqa: F401  (the plot extra: imported only to draw)


def run_figures(run: Run, title: str) -> list[Any]:
    """The pictures of a run, the first the one ``--plot`` writes: a steered run's weights, realized shares and
    losses (``mixing_figures``); the run over its steps, or per stage for a single checkpoint (no history).
    ``title`` empty: none drawn."""
    from zephon_core.report.figures import run_picture, stage_bars
    from zephon_core.report.mixing_figures import mixing_picture
    from zephon_core.report.plots import draw_mixing, draw_picture, draw_stage_bars

    steered = [draw_mixing(mixing_picture(run, run.journal, title))] if run.journal and run.journal.decisions else []
    if run.history.every_step or len(run.history.steps) > 1:
        return [*steered, draw_picture(run_picture(run, title))]
    return [*steered, draw_stage_bars(stage_bars(run, title))]


def tokens_per_step(p: Any, global_batch_size: int | None, batches_per_step: int) -> int | None:
    """Tokens a global step trains on: ``global_batch_size`` rows (else ``batches_per_step`` batches) of seq_len + 1."""
    shape = row_shape(p.definition())
    if shape is None:
        return None
    return (global_batch_size or batches_per_step * shape[0]) * shape[1]


def plan_of(p: Any, *, title: str, global_batch_size: int | None = None, batches_per_step: int | None = None,
            plot_steps: int | None = None) -> Any:
    """The planned schedule of ``p``'s work source as a ``figures.Picture``, on the axes ``zephon report`` draws runs.

    Steps are ``global_batch_size`` rows (else ``batches_per_step`` batches, default canonical_replicas);
    ``plot_steps``: the x axis ends at that global step (chunk where the plan has no steps)."""
    from zephon_core.report.plan_figures import chunk_at_step, plan_picture

    per_step = tokens_per_step(p, global_batch_size, batches_per_step or p.identity.canonical_replicas)
    span = until = None
    if plot_steps:
        span = chunk_at_step(p.work_source, plot_steps, per_step)
        # In steps, the chunk that reaches the step ends past it: the axis still ends at the step asked for.
        span, until = (plot_steps, None) if span is None else (span, float(plot_steps))
    return plan_picture(p.work_source, title, tokens_per_step=per_step, span=span, until=until)


def plan_png(p: Any, path: str, **how: Any) -> None:
    """The planned schedule of ``p`` (``plan_of(p, **how)``) drawn into ``path``, as ``zephon report`` draws runs."""
    from zephon_core.report.plots import draw_picture, write_png

    write_png(draw_picture(plan_of(p, **how)), path)
