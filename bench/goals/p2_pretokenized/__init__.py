"""P2: pretokenized pack + batch throughput (TokenArraySource, MegatronIndexedSource) against NumPy copies."""

from __future__ import annotations

from goal import Goal, Target, before_cell, loader_section, verdict
from harness import Context, fmt
from throughput import Case, case, run_rounds

TARGETS = {"P2_vs_numpy": 0.5}
FLOOR = "NumPy copy in zephon_core's document order"


def cases(base: dict, q: bool) -> list[Case]:
    t = {**base, "min_s": 1.0 if q else 2.0, "min_batches": 30 if q else 60, "warmup": 10}
    return [
        case("NumPy copy", t, "numpy_copy"),
        case("NumPy shuffled-document copy", t, "numpy_shuffled_copy"),
        case(FLOOR, t, "numpy_zephon_order_copy"),
        case("zephon_core TokenArraySource", t, "zephon_core_npy"),
        case("zephon_core MegatronIndexedSource", t, "zephon_core_megatron"),
    ]


def run(ctx: Context) -> dict:
    return run_rounds(ctx.runner, cases(ctx.base, ctx.quick), ctx.rounds, "P2")


def verdicts(R: dict) -> list[dict]:
    # Restated (#13): against a NumPy copy of the same documents in the same order as the pipeline delivers them.
    p2 = R.get("P2", {})
    npc = p2.get(FLOOR, {}).get("tokens_per_s")
    rows = []
    for name in ("zephon_core TokenArraySource", "zephon_core MegatronIndexedSource"):
        v0 = p2.get(name, {}).get("tokens_per_s")
        if v0 and npc:
            v = v0 / npc
            rows.append(verdict(f"P2 {name.split()[-1]} vs NumPy copy of its document order (tokens/s)",
                                Target(">=", TARGETS["P2_vs_numpy"]), v, f"{v:.4f}"))
    return rows


def _ratio(x: dict, ref: dict, key: str) -> float | None:
    return x[key] / ref[key] if ref.get(key) else None


def _row(name: str, x: dict, p2: dict, B: dict) -> str:
    npc, shuf = p2.get("NumPy copy", {}), p2.get("NumPy shuffled-document copy", {})
    col = before_cell(B, "P2", name, 1e6, ".2f", kept=name.startswith("zephon_core"))
    return (f"| {name} | {x['batches_per_s']:.0f} | {x['tokens_per_s'] / 1e6:.2f} | "
            f"{x['tokens_per_cpu_s'] / 1e6:.2f} | "
            f"{fmt(_ratio(x, npc, 'tokens_per_s'), '.4f')} | {fmt(_ratio(x, npc, 'tokens_per_cpu_s'), '.4f')} | "
            f"{fmt(_ratio(x, shuf, 'tokens_per_s'), '.3f')} | {x['rss_beyond_mb']:.1f} |{col}")


section = loader_section(
    "P2", "## P2 pretokenized pack + batch (median of rounds)\n",
    ["source", "batches/s", "M tokens/s", "M tokens per CPU-s", "/ NumPy copy (wall)", "/ NumPy copy (per CPU-s)",
     "/ shuffled-document copy (wall)", "peak RSS beyond MB"], "M tokens/s, per CPU-s", _row)


def keep_baseline(part: dict) -> dict:
    return {k: v for k, v in part.items() if k.startswith("zephon_core") or k == "NumPy copy"}


GOAL = Goal("P2", "pretokenized throughput", TARGETS, verdicts, section, run=run, keep_baseline=keep_baseline)
