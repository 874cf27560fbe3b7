"""``zephon blame``: a step's documents ranked by the loss the trainer logged for each.

A trainer that computes per-document losses (from the per-token source and document ids a batch's segments
carry) appends one JSON object a line to a loss log, any number of files (one a rank, say)::

    {"step": 1203, "source": "web", "document": 88123, "loss": 7.91, "tokens": 412}

``loss`` is the document's mean loss over its ``tokens`` in that step; a document in several rows or ranks of
a step may have several lines, which are combined weighted by ``tokens``. Blame reads no data.
"""

from __future__ import annotations

import argparse
import glob
import json
from collections import defaultdict
from typing import Any

from zephon_core.errors import CliError

FIELDS = ("step", "source", "document", "loss", "tokens")


def step_losses(paths: list[str], step: int) -> dict[tuple[str, int], tuple[float, int]]:
    """``(source, document) -> (mean loss, tokens)`` of ``step`` in the loss logs; a bad line is a CliError
    naming it."""
    sums: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0])
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    ok = isinstance(rec, dict) and set(FIELDS) <= set(rec) and int(rec["tokens"]) > 0
                except (ValueError, TypeError):
                    ok = False
                if not ok:
                    raise CliError(f"{path} line {n}: not a loss line (want a JSON object with {', '.join(FIELDS)}; "
                                   "tokens > 0)")
                if rec["step"] == step:
                    acc = sums[(str(rec["source"]), int(rec["document"]))]
                    acc[0] += float(rec["loss"]) * int(rec["tokens"])
                    acc[1] += int(rec["tokens"])
    return {key: (total / tokens, int(tokens)) for key, (total, tokens) in sums.items()}


def run(a: argparse.Namespace) -> int:
    paths = sorted(p for pattern in a.losses for p in glob.glob(pattern))
    if not paths:
        raise CliError(f"--losses {' '.join(a.losses)}: no such file")
    ranked = sorted(step_losses(paths, a.step).items(), key=lambda kv: (-kv[1][0], kv[0]))
    if not ranked:
        raise CliError(f"step {a.step}: no loss line in {len(paths)} file(s)")
    print(f"step {a.step}: {len(ranked)} documents, highest loss first")
    for (source, document), (loss, tokens) in ranked[: a.top]:
        print(f"  {loss:8.4f}  {tokens:6d} tokens  {source}#{document}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("blame", help="a step's documents ranked by the per-document loss a trainer logged")
    p.add_argument("--step", type=int, required=True, help="global step, from 1")
    p.add_argument("--losses", nargs="+", required=True, help="loss logs (globs): one JSON object a line")
    p.add_argument("--top", type=int, default=20, help="documents to print (default 20)")
    p.set_defaults(fn=run)
