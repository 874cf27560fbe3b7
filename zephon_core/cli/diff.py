"""``zephon diff``: two checkpoints or two recipes field by field; a checkpoint and a recipe: whether it resumes."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from zephon_core.checkpoint.merge import diff_definitions
from zephon_core.checkpoint.state import parse_lanes
from zephon_core.cli.options import add_shape_options, is_recipe, load, shape_of
from zephon_core.errors import CliError
from zephon_core.integration.state_readers import load_checked_state


def _resume_check(a: argparse.Namespace) -> int:
    """A checkpoint (``a.a``) against a recipe (``a.b``): would the recipe's pipeline resume from it,
    and why (or why not)."""
    from zephon_core.integration.frameworks import framework_of
    from zephon_core.pipeline.mixing import with_history
    from zephon_core.verify.shape import build

    state = load_checked_state(a.a)
    recipe = load(a.b)
    # The run's sizes and tokenization are in the checkpoint; options given on the command line win.
    shape = shape_of(a).filled_from(state["definition"])
    if recipe.spec.standalone is None and shape.framework is None:
        if not recipe.pretokenized and shape.tokenizer is None:
            raise CliError(f"{a.b}: a training recipe's text is tokenized with the run's tokenizer, which the "
                           "checkpoint records by fingerprint only: pass --tokenizer (the tokenizer.json or its folder "
                           "the run read)")
        shape = replace(shape, framework=framework_of(state["definition"]))
    p = build(recipe, shape, canonical_replicas=state["canonical_replicas"], prefetch=0)
    if recipe.spec.mixing is not None:  # a run of this recipe resumes with mixing on: the state's journal replayed
        p = with_history(p, state, check=False, where=a.a)
    verdict = p.resume_verdict(state)  # without [mixing], a steered state's verdict says to resume with mixing on
    print(("accepted: " if verdict.accepted else "refused: ") + verdict.message)
    for line in verdict.differences:
        print(f"  {line}")
    return 0 if verdict.accepted else 1


def run(a: argparse.Namespace) -> int:
    if is_recipe(a.a) != is_recipe(a.b):
        if is_recipe(a.a):
            raise CliError("give the checkpoint first and the recipe second: zephon diff CHECKPOINT RECIPE")
        return _resume_check(a)
    if is_recipe(a.a):
        from omegaconf import OmegaConf

        left, right = (OmegaConf.to_container(OmegaConf.structured(load(p).spec)) for p in (a.a, a.b))
        diffs = diff_definitions(left, right)
    else:
        sa, sb = load_checked_state(a.a), load_checked_state(a.b)
        la, lb = parse_lanes(sa), parse_lanes(sb)
        diffs = diff_definitions(sa["definition"], sb["definition"], "definition")
        if sa["canonical_replicas"] != sb["canonical_replicas"]:
            diffs.append(f"canonical_replicas: {sa['canonical_replicas']} vs {sb['canonical_replicas']}")
        diffs += diff_definitions(sa["topology"], sb["topology"], "topology")
        for lane in sorted(set(la) | set(lb)):
            x, y = la.get(lane), lb.get(lane)
            if x != y:
                fmt = lambda s: (  # noqa: E731
                    "absent" if s is None else f"cursor={tuple(s.cursor)} delivered={s.delivered}")
                diffs.append(f"lanes[{lane}]: {fmt(x)} vs {fmt(y)}")
    if not diffs:
        print("identical")
        return 0
    for line in diffs:
        print(line)
    return 1


def register(sub: Any) -> None:
    p = sub.add_parser("diff", help="field-by-field differences between two checkpoints or two recipes; "
                                     "a checkpoint and a recipe: whether the recipe resumes from it")
    p.add_argument("a")
    p.add_argument("b")
    add_shape_options(p)
    p.set_defaults(fn=run)
