"""P5: checkpoint size (canonical JSON) per lane, and what one ``checkpoint()`` call costs."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import Any

from goal import Goal, Target, verdict
from harness import Context
from loaders.common import load_tokenizer
from loaders.zephon_core import pretok_pipeline, tokenize_pipeline
from measure import emit, perf

TARGETS = {"P5_bytes_per_lane": 256.0}


def _median_ms(fn: Callable[[], Any], n: int = 20) -> float:
    ts = []
    for _ in range(n):
        t0 = perf()
        fn()
        ts.append(perf() - t0)
    return statistics.median(ts) * 1e3


def _by_lanes(a: dict, out: dict) -> None:
    """State bytes and the checkpoint() call of the pretokenized pipeline at each canonical_replicas."""
    from zephon_core.checkpoint.state import canonical_json

    for C in a["lanes"]:
        p = pretok_pipeline(a, "npy", canonical_replicas=C, prefetch=0)
        it = iter(p)
        for _ in range(3 * C):
            next(it)
        st = p.checkpoint()
        t0 = perf()
        for _ in range(10):
            p.checkpoint()
        out.setdefault("checkpoint_call_ms_pretok", {})[str(C)] = (perf() - t0) / 10 * 1e3
        p.close()
        lanes_part = len(canonical_json(st["lanes"]))
        out["by_lanes"][str(C)] = {"total": len(canonical_json(st)), "lanes_json": lanes_part,
                                   "example_lane": st["lanes"][str(C - 1)]}
    Cs = sorted(int(c) for c in out["by_lanes"])
    lo, hi = out["by_lanes"][str(Cs[0])], out["by_lanes"][str(Cs[-1])]
    out["marginal_bytes_per_lane"] = (hi["total"] - lo["total"]) / (Cs[-1] - Cs[0])
    out["total_over_lanes_at_max"] = hi["total"] / Cs[-1]


def _tokenize(a: dict, out: dict) -> None:
    """The tokenize pipeline (P1 definition): its fixed part (definition + fingerprint), and what one
    checkpoint() call costs (world_size 1: no aggregation, just building the state)."""
    from zephon_core.checkpoint.state import canonical_json
    from zephon_core.lane.ops import tokenizer_identity

    p = tokenize_pipeline(a, 1, canonical_replicas=8, prefetch=0)
    it = iter(p)
    for _ in range(8):
        next(it)
    st = p.checkpoint()
    out["checkpoint_call_ms_tokenize"] = _median_ms(p.checkpoint)
    tok = load_tokenizer(a["tokenizer"])
    out["tokenizer_identity_ms"] = _median_ms(lambda: tokenizer_identity(tok))
    out["tokenizer_json_bytes"] = len(tok.to_str())
    p.close()
    out["tokenize_pipeline_C8_total"] = len(canonical_json(st))
    out["tokenize_pipeline_definition"] = len(canonical_json(st["definition"]))


def case_state_bytes(a: dict) -> None:
    """Checkpoint JSON bytes as a function of canonical_replicas (lanes), and the checkpoint() calls."""
    from zephon_core.checkpoint.state import canonical_json

    out: dict[str, Any] = {"by_lanes": {}}
    _by_lanes(a, out)
    _tokenize(a, out)
    # A far-future lane: every cursor field at 10^9 (digits grow with progress), and its tally of one
    # source: 10^9 batches of 8 rows, 10^13 tokens (a lane's share of a very long run)
    far_tally = {"since": 0, "rows": 8 * 10**9, "padding": 10**9, "cut": 10**10, "tokens": [[10**13]],
                 "documents": [[10**10]]}
    far = {"cursor": [10**9, 10**6, 10**6, 10**4], "delivered": 10**9, "tally": far_tally}
    out["far_lane_bytes"] = len(canonical_json({"63": far})) - 2 + 1  # entry plus its comma
    emit(out)


def run(ctx: Context) -> dict:
    return ctx.runner.case("project", "state_bytes", {**ctx.base, "lanes": [1, 8, 64]}, timeout=300)


def verdicts(R: dict) -> list[dict]:
    p5 = R.get("P5", {})
    if "marginal_bytes_per_lane" not in p5:
        return []
    v = p5["marginal_bytes_per_lane"]
    return [verdict("P5 checkpoint bytes per lane (JSON, marginal)", Target("<=", TARGETS["P5_bytes_per_lane"], " B"),
                    v, f"{v:.0f} B (far-future lane {p5['far_lane_bytes']} B)")]


def section(R: dict, B: dict) -> list[str]:
    if "P5" not in R or "by_lanes" not in R["P5"]:
        return []
    p5 = R["P5"]
    L = ["## P5 checkpoint size (canonical JSON)\n",
         "| canonical_replicas | state bytes | of which lanes | example lane |", "|---|---|---|---|"]
    for C, x in p5["by_lanes"].items():
        lane = json.dumps(x["example_lane"], separators=(",", ":"))
        L.append(f"| {C} | {x['total']} | {x['lanes_json']} | `{lane}` |")
    L.append(f"\nMarginal bytes per lane: {p5['marginal_bytes_per_lane']:.1f}; a lane with every cursor field at its "
             f"far-future size: {p5['far_lane_bytes']} B; the tokenize pipeline's fixed part (definition) "
             f"{p5['tokenize_pipeline_definition']} B, whole state at C=8: {p5['tokenize_pipeline_C8_total']} B.  ")
    L.append(f"One `checkpoint()` call (world_size 1): tokenize pipeline {p5['checkpoint_call_ms_tokenize']:.2f} ms, "
             f"of which hashing the tokenizer (`tokenizer_identity`, {p5['tokenizer_json_bytes'] / 1e3:.0f} kB of "
             "JSON) "
             f"{p5['tokenizer_identity_ms']:.2f} ms; pretokenized: "
             + ", ".join(f"C={k} {v:.2f} ms" for k, v in p5["checkpoint_call_ms_pretok"].items()) + ".  ")
    b5 = B.get("P5", {})
    if "checkpoint_call_ms_pretok" in b5:
        L.append(f"Before ({B.get('commit', '')}): tokenize pipeline {b5['checkpoint_call_ms_tokenize']:.2f} ms; "
                 "pretokenized: "
                 + ", ".join(f"C={k} {v:.2f} ms" for k, v in b5["checkpoint_call_ms_pretok"].items()) + ".")
    return L + [""]


def keep_baseline(part: dict) -> dict:
    return {k: v for k, v in part.items() if k.startswith(("checkpoint_call", "tokenizer_identity", "marginal"))}


GOAL = Goal("P5", "checkpoint bytes", TARGETS, verdicts, section, run=run, cases={"state_bytes": case_state_bytes},
            keep_baseline=keep_baseline)
