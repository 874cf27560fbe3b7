"""``zephon skip``: journal steps to skip in a checkpoint state, so the resume leaves out their data.

The state is rewritten atomically (a reader sees the old file or the whole new one); its lanes are not
touched, only the surgery journal (``zephon_core.checkpoint.surgery``) gains the skip. Without
``--steps`` it prints the state's journal.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from zephon_core.checkpoint.state import parse_lanes, skip_in_state
from zephon_core.checkpoint.surgery import surgery_journal_of
from zephon_core.errors import CliError
from zephon_core.integration.state_readers import load_checked_state
from zephon_core.io.atomic import write_atomically
from zephon_core.pipeline.surgery import steps_of


def run(a: argparse.Namespace) -> int:
    if not a.state.endswith(".json"):
        raise CliError(f"--state {a.state}: zephon skip edits a state's .json file; for a framework checkpoint, "
                       "use the adapter's skip setting (docs/when_a_run_goes_wrong.md)")
    state = load_checked_state(a.state)
    lanes = parse_lanes(state)
    if a.steps is not None:
        first, last = steps_of(a.steps, "--steps")
        B = a.batches_per_step or state["canonical_replicas"]
        state = skip_in_state(state, first, last, B)
        out = a.out or a.state
        data = (json.dumps(state) + "\n").encode()
        write_atomically(out, lambda f: f.write(data), durable=True)
        print(f"{out}: steps {first}..{last} ({B} batches a step) will be skipped on resume")
    journal = surgery_journal_of(state)
    at = max((ls.delivered for ls in lanes.values()), default=0)
    print(f"state at lane batch {at}; skips: " + (", ".join(str(s) for s in journal.skips) or "none")
          + "; quarantined: " + ("; ".join(str(q) for q in journal.quarantines) or "none"))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("skip", help="skip the data of global steps A..B when a run resumes from a state")
    p.add_argument("--state", required=True, help="the checkpoint state's .json file (edited in place unless --out)")
    p.add_argument("--steps", help="global steps A..B to skip (from 1, inclusive); without it: print the journal")
    p.add_argument("--batches-per-step", type=int,
                   help="batches of every rank together in one step (default: canonical_replicas; Megatron: "
                        "global batch size / micro-batch size)")
    p.add_argument("--out", help="write the new state here instead of over --state")
    p.set_defaults(fn=run)
