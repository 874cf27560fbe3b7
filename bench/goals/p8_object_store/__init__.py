"""P8: object-store reads: range GETs per 1M tokens and tokens/s with 20 ms per request, against local disk
(``case_s3_reads`` in s3_reads.py, this package)."""

from __future__ import annotations

from goal import Goal, Target, verdict
from harness import Context, log

from goals.p8_object_store import s3_reads

TARGETS = {"P8_gets_per_1m_tokens": 10.0, "P8_s3_over_local": 0.5}


def run(ctx: Context) -> dict:
    x = ctx.runner.case("project", "s3_reads", {**ctx.base, "work": str(ctx.work), "batches": 60 if ctx.quick else 300},
                        timeout=1800)
    if "error" not in x:
        log(f"  P8 blocks: {x['s3_blocks_gets_per_1m_tokens']:.1f} GETs/1M tokens, "
            f"S3/local {x['blocks_s3_over_local']:.2f}; "
            f"per document: {x['s3_per_document_gets_per_1m_tokens']:.1f} GETs/1M tokens, "
            f"S3/local {x['per_document_s3_over_local']:.2f}")
    return x


def verdicts(R: dict) -> list[dict]:
    p8 = R.get("P8", {})
    if "s3_blocks_gets_per_1m_tokens" not in p8:
        return []
    v, w = p8["s3_blocks_gets_per_1m_tokens"], p8["blocks_s3_over_local"]
    return [verdict("P8 object-store GETs per 1M tokens, block mode", Target("<=", TARGETS["P8_gets_per_1m_tokens"]), v,
                    f"{v:.1f}"),
            verdict("P8 throughput with 20 ms per request vs local disk, block mode",
                    Target(">=", TARGETS["P8_s3_over_local"]), w, f"{w:.2f}")]


def section(R: dict, B: dict) -> list[str]:
    x = R.get("P8")
    if not x or "error" in x:
        return []
    L = [f"## P8 object-store reads (moto on loopback, {x['latency_ms']} ms added per request by the proxy)\n",
         "| shuffle | GETs per 1M tokens | tokens/s S3 | tokens/s local | S3 / local |", "|---|---|---|---|---|"]
    for mode in ("per_document", "blocks"):
        L.append(f"| {mode.replace('_', '-')} | {x[f's3_{mode}_gets_per_1m_tokens']:.1f} | "
                 f"{x[f's3_{mode}_tokens_per_s'] / 1e3:.0f} k | {x[f'local_{mode}_tokens_per_s'] / 1e3:.0f} k | "
                 f"{x[f'{mode}_s3_over_local']:.2f} |")
    return L + [""]


GOAL = Goal("P8", "object-store reads (GETs per 1M tokens, 20 ms latency)", TARGETS, verdicts, section, run=run,
            cases={"s3_reads": s3_reads.case})
