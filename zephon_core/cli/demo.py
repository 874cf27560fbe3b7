"""The core-only elastic demo: ``python -m zephon_core.cli.demo``.

Trains nothing: it runs the data path of the bundled ``configs/data/demo.toml``
(from the clone, or from the installed package) on 8
data-parallel groups, checkpoints, resumes on 4 groups, checkpoints again,
resumes on 2, and checks every global step against an uninterrupted 8-group
run. Exit status 0 when every step matched.
"""

from __future__ import annotations

import argparse
import sys

from zephon_core.cli.errors import debug_option, run
from zephon_core.integration import bundled_configs
from zephon_core.recipe import load_recipe
from zephon_core.verify.simulate import Phase, first_mismatch, run_schedule


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", help="default: the bundled configs/data/demo.toml")
    ap.add_argument("--steps", type=int, nargs=3, default=[4, 3, 3], metavar=("AT_8", "AT_4", "AT_2"))
    ap.add_argument("--batches-per-step", type=int, default=16)
    debug_option(ap, False)
    args = ap.parse_args(argv)
    return run(_demo, args, "zephon demo", debug=args.debug)


def _demo(args: argparse.Namespace) -> int:
    args.recipe = args.recipe or str(bundled_configs() / "data" / "demo.toml")
    recipe = load_recipe(args.recipe)
    C = recipe.spec.canonical_replicas or 8

    def make(G: int, gid: int):
        return recipe.build_standalone(dp_degree=G, dp_group_id=gid, canonical_replicas=C, prefetch=0)

    total = sum(args.steps)
    print(f"recipe {args.recipe}: canonical_replicas={C}, {args.batches_per_step} batches per global step")
    reference = run_schedule(make, [Phase(8, total)], args.batches_per_step)
    degrees = (8, 4, 2)
    elastic = run_schedule(make, [Phase(G, n) for G, n in zip(degrees, args.steps)], args.batches_per_step)
    step = 0
    for G, n in zip(degrees, args.steps):
        for _ in range(n):
            same = reference[step].digests == elastic[step].digests
            rows = len(elastic[step].digests)
            print(f"  step {step + 1:2d}  dp_degree={G}  rows={rows:3d}  {'match' if same else 'DIFFERENT'}")
            step += 1
    bad = first_mismatch(reference, elastic)
    if bad is None:
        print(f"all {total} global steps matched the uninterrupted run across 8 -> 4 -> 2 data-parallel groups")
        return 0
    print(f"step {bad + 1} differs from the uninterrupted run", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
