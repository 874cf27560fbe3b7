"""The ``zephon`` command line: plan, inspect, compare, verify, trace and report on data.

Every command takes ``--help``. Errors print one line and exit 1 (``--debug``
or ``ZEPHON_DEBUG=1`` adds the traceback); usage errors exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from zephon_core.checkpoint.merge import diff_definitions
from zephon_core.checkpoint.state import parse_lanes
from zephon_core.integration.state_readers import load_state
from zephon_core.tools import curriculum_audit
from zephon_core.tools.errors import CliError, debug_option, run
from zephon_core.tools.from_megatron import add_from_megatron_parser
from zephon_core.tools.index import add_index_parser
from zephon_core.tools.init import add_init_parser
from zephon_core.tools.progress import Progress
from zephon_core.tools.report import add_plan_plot_options, add_report_parser
from zephon_core.tools.shape import add_shape_options


# -- loading ----------------------------------------------------------------------
def _recipe(path: str):
    from zephon_core.recipe import load_recipe

    return load_recipe(path)


def _pipeline(recipe: Any, a: argparse.Namespace, **options: Any):
    from zephon_core.tools.shape import Shape, build

    return build(recipe, Shape(a.tokenizer, a.seq_len, a.batch_size, a.framework), **options)


def _is_recipe(path: str) -> bool:
    return path.endswith(".toml")


# -- commands -----------------------------------------------------------------------
def cmd_explain(a: argparse.Namespace) -> int:
    recipe = _recipe(a.recipe)
    opts: dict[str, Any] = {"world_size": a.world_size, "global_rank": 0}
    if a.dp_degree is not None:
        opts["dp_degree"] = a.dp_degree
    if a.canonical_replicas is not None:
        opts["canonical_replicas"] = a.canonical_replicas
    if a.world_size > 1:
        opts.setdefault("aggregate_dir", recipe.spec.aggregate.dir or "<aggregate_dir>")
        opts.setdefault("run_id", recipe.spec.aggregate.run_id or "run")
    p = _pipeline(recipe, a, **opts)
    print(p.explain(pipelines_per_node=a.per_node))
    if a.plot:
        from zephon_core.tools.report import plot_plan

        plot_plan(p, recipe, a)
    return 0


def cmd_inspect(a: argparse.Namespace) -> int:
    state = load_state(a.checkpoint)
    lanes = parse_lanes(state)
    if a.json:
        print(json.dumps(state, indent=2, sort_keys=True))
        return 0
    d = state["definition"]
    print(f"{a.checkpoint}")
    print(f"  format:             {state['format']} version {state['version']}")
    print(f"  fingerprint:        {state['fingerprint']}")
    print(f"  canonical_replicas: {state['canonical_replicas']}")
    print("  topology:           " + ", ".join(f"{k}={v}" for k, v in sorted(state["topology"].items())))
    ws = d.get("work_source", {})
    print(f"  work source:        {ws.get('kind')} seed={ws.get('seed')} chunk_size={ws.get('chunk_size')} exhausted={ws.get('exhausted')}")
    for s in ws.get("sources", []):
        weight = f" weight={s['weight']}" if "weight" in s else ""
        # A fingerprint records a source's documents where it knows them, else its files' bytes.
        size = f"documents={s['documents']}" if "documents" in s else f"bytes={s['size']}" if "size" in s else "size=?"
        print(f"    {s.get('name')}: {s.get('kind')}{weight} {size}")
    for n, st in enumerate(ws.get("stages", [])):
        weights = ", ".join(f"{k}={v}" for k, v in st.get("weights", {}).items())
        print(f"    stage {n} {st.get('name')!r}: from global chunk {st.get('start_chunk')} ({st.get('start')}), weight_by={st.get('weight_by')}: {weights}")
    print("  operators:          " + " -> ".join(op.get("op", "?") for op in d.get("ops", [])))
    print("  lanes:              lane  chunk  document  token  in-window  delivered")
    for lane in sorted(lanes):
        c = lanes[lane].cursor
        print(f"                      {lane:4d}  {c.chunk:5d}  {c.document:8d}  {c.token:5d}  {c.delivered_in_window:9d}  {lanes[lane].delivered:9d}")
    missing = [lane for lane in range(state["canonical_replicas"]) if lane not in lanes]
    if missing:
        print(f"  partial state: no progress for lane(s) {missing} (a per-group state; merge before an elastic restore)")
    return 0


def _resume_check(a: argparse.Namespace) -> int:
    """A checkpoint (``a.a``) against a recipe (``a.b``): would the recipe's pipeline resume from it, and why (or why not)."""
    from zephon_core.tools.shape import build, shape_of

    state = load_state(a.a)
    parse_lanes(state)
    # The run's sizes are in the checkpoint; options given on the command line win.
    shape = shape_of(a, state["definition"])
    p = build(_recipe(a.b), shape, canonical_replicas=state["canonical_replicas"], prefetch=0)
    verdict = p.resume_verdict(state)
    print(("accepted: " if verdict.accepted else "refused: ") + verdict.message)
    for line in verdict.differences:
        print(f"  {line}")
    return 0 if verdict.accepted else 1


def cmd_diff(a: argparse.Namespace) -> int:
    if _is_recipe(a.a) != _is_recipe(a.b):
        if _is_recipe(a.a):
            raise CliError("give the checkpoint first and the recipe second: zephon diff CHECKPOINT RECIPE")
        return _resume_check(a)
    if _is_recipe(a.a):
        from omegaconf import OmegaConf

        left, right = (OmegaConf.to_container(OmegaConf.structured(_recipe(p).spec)) for p in (a.a, a.b))
        diffs = diff_definitions(left, right)
    else:
        sa, sb = load_state(a.a), load_state(a.b)
        la, lb = parse_lanes(sa), parse_lanes(sb)
        diffs = diff_definitions(sa["definition"], sb["definition"], "definition")
        if sa["canonical_replicas"] != sb["canonical_replicas"]:
            diffs.append(f"canonical_replicas: {sa['canonical_replicas']} vs {sb['canonical_replicas']}")
        diffs += diff_definitions(sa["topology"], sb["topology"], "topology")
        for lane in sorted(set(la) | set(lb)):
            x, y = la.get(lane), lb.get(lane)
            if x != y:
                fmt = lambda s: "absent" if s is None else f"cursor={tuple(s.cursor)} delivered={s.delivered}"  # noqa: E731
                diffs.append(f"lanes[{lane}]: {fmt(x)} vs {fmt(y)}")
    if not diffs:
        print("identical")
        return 0
    for line in diffs:
        print(line)
    return 1


def cmd_verify_elastic(a: argparse.Namespace) -> int:
    from zephon_core.tools import simulate

    recipe = _recipe(a.recipe)
    C = a.canonical_replicas
    B = a.batches_per_step or C
    for G in (a.from_, a.to):
        if G > C:
            raise CliError(f"dp_degree {G} exceeds --canonical-replicas {C}")
        if B % G:
            raise CliError(f"--batches-per-step {B} is not a multiple of dp_degree {G}")
    if not 0 < a.checkpoint_step < a.steps:
        raise CliError(f"--checkpoint-step must be between 1 and --steps - 1 ({a.steps - 1})")
    progress = Progress(a.steps * 2, a)

    resumed = _recipe(a.resume_recipe) if a.resume_recipe else recipe

    def maker(r: Any):
        return lambda G, gid: _pipeline(r, a, dp_degree=G, dp_group_id=gid, canonical_replicas=C, prefetch=0)

    # The reference runs uninterrupted on the first topology (with the resumed recipe's curriculum throughout).
    ref_records, ref_state = simulate.run_phase(maker(resumed), simulate.Phase(a.from_, a.steps), B, None,
                                                lambda ph: progress.step(f"reference dp={ph.dp_degree}"))
    recs, state = simulate.run_phase(maker(recipe), simulate.Phase(a.from_, a.checkpoint_step), B, None,
                                     lambda ph: progress.step(f"elastic dp={ph.dp_degree}"))
    more, _ = simulate.run_phase(maker(resumed), simulate.Phase(a.to, a.steps - a.checkpoint_step), B, state,
                                 lambda ph: progress.step(f"elastic dp={ph.dp_degree}"))
    change = f"{a.from_} -> {a.to} at step {a.checkpoint_step}" + (f", resumed with {a.resume_recipe}" if a.resume_recipe else "")
    bad = simulate.first_mismatch(ref_records, recs + more, provenance=True)
    ws = maker(resumed)(1, 0).work_source
    audit = curriculum_audit.audit_curriculum(ws, curriculum_audit.chunks_read(ref_state))
    if bad is None and not audit.problems:
        print(f"ok: {a.steps} global steps identical: dp_degree {a.from_} throughout vs {change} (C={C}, {B} batches per step)")
        print(audit.summary(ws))
        return 0
    if bad is not None:
        print(f"MISMATCH at global step {bad + 1}: dp_degree {change} changes the samples of that step (C={C}, {B} batches per step)")
    for problem in audit.problems:
        print(f"CURRICULUM: {problem}")
    return 1


def cmd_trace(a: argparse.Namespace) -> int:
    from zephon_core.lane.assignment import owned_lanes

    recipe = _recipe(a.recipe)
    C = a.canonical_replicas or recipe.spec.canonical_replicas or 1
    B = a.batches_per_step or C
    if B % C:
        raise CliError(f"--batches-per-step {B} must be a multiple of canonical_replicas {C} for a step's contents to be topology-free")
    if a.step < 1:
        raise CliError("--step counts from 1")
    p = _pipeline(recipe, a, dp_degree=1, dp_group_id=0, canonical_replicas=C, prefetch=0)
    names = [s.name for s in p.work_source.sources]
    progress = Progress(a.step * B, a)
    with p:
        it = iter(p)
        batches = []
        for n in range(a.step * B):
            b = next(it)
            progress.step(f"batch {n + 1} of step {n // B + 1}")
            if n >= (a.step - 1) * B:
                batches.append(b)
        state = p.checkpoint()
    print(f"global step {a.step}: {B} batches (C={C}; lanes {owned_lanes(C, 1, 0)})")
    for b in sorted(batches, key=lambda b: (b.lane, b.lane_index)):
        g = b.lane + b.cursor.chunk * C
        stage = curriculum_audit.stage_name(p.work_source, g)
        where = f"  (then at global chunk {g}" + (f", stage {stage!r})" if stage else ")")
        print(f"  lane {b.lane} batch {b.lane_index}  digest {b.digest}{where}")
        for r, segs in enumerate(b.provenance):
            parts = ", ".join(f"{names[s.source]}#{s.document}[{s.start}:{s.stop}]" for s in segs)
            print(f"    row {r}: {parts}")
    audit = curriculum_audit.audit_curriculum(p.work_source, curriculum_audit.chunks_read(state))
    print(audit.summary(p.work_source))
    for problem in audit.problems:
        print(f"  CURRICULUM: {problem}")
    return 1 if audit.problems else 0


# -- parser -------------------------------------------------------------------------
def _progress_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is not a terminal")
    p.add_argument("--no-progress", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="zephon",
                                 description="Plan, inspect, compare, verify, trace and report on Zephon pipelines.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    shape, progress = add_shape_options, _progress_options
    p = sub.add_parser("explain", help="show the plan of a recipe without loading data")
    p.add_argument("recipe")
    p.add_argument("--dp-degree", type=int)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--per-node", type=int, help="pipelines per node (default LOCAL_WORLD_SIZE or 1)")
    p.add_argument("--canonical-replicas", type=int)
    add_plan_plot_options(p)
    shape(p)
    p.set_defaults(fn=cmd_explain)

    p = sub.add_parser("inspect", help="show a checkpoint state (JSON, TorchTitan DCP folder, Megatron loader state)")
    p.add_argument("checkpoint")
    p.add_argument("--json", action="store_true", help="print the raw state")
    p.set_defaults(fn=cmd_inspect)

    p = sub.add_parser("diff", help="field-by-field differences between two checkpoints or two recipes; "
                                     "a checkpoint and a recipe: whether the recipe resumes from it")
    p.add_argument("a")
    p.add_argument("b")
    shape(p)
    p.set_defaults(fn=cmd_diff)

    p = sub.add_parser("verify-elastic", help="check that a topology change at a checkpoint keeps every step's samples")
    p.add_argument("recipe")
    p.add_argument("--canonical-replicas", type=int, required=True)
    p.add_argument("--from", dest="from_", type=int, required=True, metavar="G1")
    p.add_argument("--to", type=int, required=True, metavar="G2")
    p.add_argument("--checkpoint-step", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batches-per-step", type=int, help="default: canonical_replicas")
    p.add_argument("--resume-recipe", metavar="RECIPE2", help="resume the checkpoint with this recipe (e.g. with a stage appended); "
                   "the reference then runs RECIPE2 throughout")
    progress(p)
    shape(p)
    p.set_defaults(fn=cmd_verify_elastic)

    p = sub.add_parser("trace", help="which documents (and token ranges) make up a global step")
    p.add_argument("recipe")
    p.add_argument("--step", type=int, required=True, help="global step, from 1")
    p.add_argument("--canonical-replicas", type=int)
    p.add_argument("--batches-per-step", type=int, help="default: canonical_replicas")
    progress(p)
    shape(p)
    p.set_defaults(fn=cmd_trace)

    add_report_parser(sub)
    add_index_parser(sub)
    add_init_parser(sub)
    add_from_megatron_parser(sub)
    for sp in sub.choices.values():
        debug_option(sp, argparse.SUPPRESS)
    debug_option(ap, False)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args.fn, args, f"zephon {args.command}", debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
