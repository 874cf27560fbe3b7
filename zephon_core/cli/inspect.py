"""``zephon inspect``: a checkpoint state, as text or JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

from zephon_core.checkpoint.state import parse_lanes
from zephon_core.curriculum.definition import parse_definition
from zephon_core.integration.state_readers import load_checked_state


def run(a: argparse.Namespace) -> int:
    state = load_checked_state(a.checkpoint)
    lanes = parse_lanes(state)
    if a.json:
        print(json.dumps(state, indent=2, sort_keys=True))
        return 0
    D = parse_definition(state["definition"])
    ws = D.work_source
    print(f"{a.checkpoint}")
    print(f"  format:             {state['format']} version {state['version']}")
    print(f"  fingerprint:        {state['fingerprint']}")
    print(f"  canonical_replicas: {state['canonical_replicas']}")
    print("  topology:           " + ", ".join(f"{k}={v}" for k, v in sorted(state["topology"].items())))
    if ws is None:
        print(f"  work source:        {state['definition']['work_source'].get('kind')}")
    else:
        print(f"  work source:        {ws.kind} seed={ws.seed} chunk_size={ws.chunk_size} exhausted={ws.exhausted}")
    for s in ws.sources if ws is not None else ():
        weight = f" weight={s.weight}" if s.weight is not None else ""
        # A fingerprint records a source's documents where it knows them, else its files' bytes.
        fp = s.fingerprint
        size = f"bytes={fp['size']}" if "size" in fp else "size=?"
        size = f"documents={s.documents}" if s.documents is not None else size
        print(f"    {s.name}: {fp.get('kind')}{weight} {size}")
    for n, st in enumerate(ws.stages if ws is not None and not ws.static else ()):
        weights = ", ".join(f"{k}={v}" for k, v in st.weights.items())
        print(f"    stage {n} {st.name!r}: from global chunk {st.start_chunk} ({st.start}), "
              f"weight_by={st.weight_by}: {weights}")
    print("  operators:          " + " -> ".join(op["op"] for op in D.ops))
    print("  lanes:              lane  chunk  document  token  in-window  delivered")
    for lane in sorted(lanes):
        c = lanes[lane].cursor
        print(f"                      {lane:4d}  {c.chunk:5d}  {c.document:8d}  {c.token:5d}  "
              f"{c.delivered_in_window:9d}  {lanes[lane].delivered:9d}")
    missing = [lane for lane in range(state["canonical_replicas"]) if lane not in lanes]
    if missing:
        print(f"  partial state: no progress for lane(s) {missing} "
              "(a per-group state; merge before an elastic restore)")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("inspect", help="show a checkpoint state (JSON, TorchTitan DCP folder, Megatron loader state)")
    p.add_argument("checkpoint")
    p.add_argument("--json", action="store_true", help="print the raw state")
    p.set_defaults(fn=run)
