"""``zephon quarantine``: journal documents to leave out of a run from its checkpoint state on.

The state's JSON file is rewritten atomically with the quarantine in its surgery journal
(``zephon_core.checkpoint.surgery``); its lanes are not touched. Each lane leaves the documents out from the
first chunk it has not begun to read, which needs the run's recipe and shape (as ``zephon trace`` does).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from zephon_core.cli.options import add_shape_options, load, pipeline
from zephon_core.errors import CliError
from zephon_core.integration.state_readers import load_checked_state
from zephon_core.io.atomic import write_atomically


def parse_document(text: str) -> tuple[str, int]:
    """``SOURCE#N`` as ``(source, N)``; anything else is a CliError naming ``--document``."""
    source, sep, number = text.rpartition("#")
    if not sep or not source or not number.isdigit():
        raise CliError(f"--document {text!r}: name a document as SOURCE#N (a source's name, a document number), "
                       "as zephon ledger prints it")
    return source, int(number)


def run(a: argparse.Namespace) -> int:
    from zephon_core.pipeline.surgery import quarantined_state

    if not a.state.endswith(".json"):
        raise CliError(f"--state {a.state}: zephon quarantine edits a state's .json file")
    documents = [parse_document(d) for d in a.document]
    recipe = load(a.recipe)
    state = load_checked_state(a.state)
    C = int(state["canonical_replicas"])
    with pipeline(recipe, a, dp_degree=1, dp_group_id=0, canonical_replicas=C, prefetch=0) as p:
        new = quarantined_state(p, state, documents)
    out = a.out or a.state
    data = (json.dumps(new) + "\n").encode()
    write_atomically(out, lambda f: f.write(data), durable=True)
    q = [q for q in p.surgery.quarantines][-1]
    print(f"{out}: {q} quarantined from lane chunks {list(q.from_chunks)} on")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("quarantine", help="leave documents out of a run from its checkpoint state on")
    p.add_argument("recipe")
    p.add_argument("--state", required=True, help="the checkpoint state's .json file (edited in place unless --out)")
    p.add_argument("--document", action="append", required=True, help="SOURCE#N (repeatable)")
    p.add_argument("--out", help="write the new state here instead of over --state")
    add_shape_options(p)
    p.set_defaults(fn=run)
