"""``zephon inspect``: a checkpoint state, as text or JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

from zephon_core.checkpoint.state import parse_lanes
from zephon_core.integration.state_readers import load_state


def run(a: argparse.Namespace) -> int:
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
    print(f"  work source:        {ws.get('kind')} seed={ws.get('seed')} chunk_size={ws.get('chunk_size')} "
          f"exhausted={ws.get('exhausted')}")
    for s in ws.get("sources", []):
        weight = f" weight={s['weight']}" if "weight" in s else ""
        # A fingerprint records a source's documents where it knows them, else its files' bytes.
        size = f"documents={s['documents']}" if "documents" in s else f"bytes={s['size']}" if "size" in s else "size=?"
        print(f"    {s.get('name')}: {s.get('kind')}{weight} {size}")
    for n, st in enumerate(ws.get("stages", [])):
        weights = ", ".join(f"{k}={v}" for k, v in st.get("weights", {}).items())
        print(f"    stage {n} {st.get('name')!r}: from global chunk {st.get('start_chunk')} ({st.get('start')}), "
              f"weight_by={st.get('weight_by')}: {weights}")
    print("  operators:          " + " -> ".join(op.get("op", "?") for op in d.get("ops", [])))
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
