"""``zephon quarantine``: journal documents to leave out of a run from its checkpoint state on.

The state's JSON file is rewritten atomically with the quarantine in its surgery journal
(``zephon_core.checkpoint.surgery``); its lanes are not touched. A steered run's state works as any other: the
recipe's pipeline is rebuilt with its mixing journal replayed (``pipeline.mixing.with_history``). Each lane leaves
the documents out from the first chunk it has not begun to read, which needs the run's recipe and shape (as
``zephon trace`` does). A document named by its content hash is every document with that content
(``verify.content_hashes``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from zephon_core.cli.options import add_shape_options, load, pipeline, progress_options
from zephon_core.cli.progress import Progress
from zephon_core.errors import CliError
from zephon_core.integration.state_readers import load_checked_state
from zephon_core.io.atomic import write_atomically


def resolve_hashes(hashes: list[str], p: Any, a: argparse.Namespace) -> list[tuple[str, int]]:
    """Every document whose content has one of ``hashes``: from ``--ledger``'s Parquet file, else one pass over the
    recipe's sources (a progress bar on stderr); each hash's documents are printed."""
    from zephon_core.verify import content_hashes

    if not hashes:
        return []
    if a.ledger:
        found, where = content_hashes.in_ledger(a.ledger, hashes), f"{a.ledger}, the documents its run trained on"
    else:
        sources = p.work_source.sources
        progress = Progress(content_hashes.scan_blocks(sources), a)
        found = content_hashes.scan(sources, hashes, progress.step)
        where = f"every document of {', '.join(s.name for s in sources)}"
    documents = content_hashes.resolve(hashes, found, where)
    for h in dict.fromkeys(hashes):
        print(f"{h}: {', '.join(f'{s}#{d}' for s, d in found[h])}")
    return documents


def run(a: argparse.Namespace) -> int:
    from zephon_core.pipeline.mixing import with_history
    from zephon_core.pipeline.surgery import document_of, quarantined_state
    from zephon_core.verify.content_hashes import is_content_hash

    if not a.state.endswith(".json"):
        raise CliError(f"--state {a.state}: zephon quarantine edits a state's .json file")
    hashes = [d for d in a.document if is_content_hash(d)]
    documents = [document_of(d, "--document", "or give its content hash (16 hex digits)")
                 for d in a.document if d not in hashes]
    recipe = load(a.recipe)
    state = load_checked_state(a.state)
    C = int(state["canonical_replicas"])
    # As the run had it: a steered run's decided stages replayed, so its state restores.
    p = with_history(pipeline(recipe, a, dp_degree=1, dp_group_id=0, canonical_replicas=C, prefetch=0), state,
                     where=a.state)
    with p:
        new = quarantined_state(p, state, documents + resolve_hashes(hashes, p, a))
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
    p.add_argument("--document", action="append", required=True,
                   help="SOURCE#N, or a content hash (every document with that content) as zephon ledger prints it "
                        "(repeatable)")
    p.add_argument("--ledger", metavar="FILE.parquet", help="find --document hashes in this ledger (zephon ledger "
                   "--parquet) instead of reading the sources: only the documents that run trained on are there")
    progress_options(p)
    p.add_argument("--out", help="write the new state here instead of over --state")
    add_shape_options(p)
    p.set_defaults(fn=run)
