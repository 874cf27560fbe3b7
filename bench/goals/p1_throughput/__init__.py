"""P1: tokenize + pack + batch throughput for one rank, against zephon 0.2.0, torchdata, Grain and the floors."""

from __future__ import annotations

from goal import Goal, Target, before_cell, loader_section, verdict
from harness import Context, fmt
from throughput import Case, case, run_rounds

TARGETS = {"P1_vs_zephon020": 2.0, "P1_vs_generator": 1.0}


def cases(base: dict, q: bool) -> list[Case]:
    t = {**base, "min_s": 1.0 if q else 2.0, "min_batches": 10 if q else 20, "warmup": 3 if q else 5}
    return [
        case("zephon_core p=1", t, "zephon_core", parallelism=1),
        case("zephon_core p=2", t, "zephon_core", parallelism=2),
        case("zephon_core p=1 sync (prefetch=0, reader_threads=0)", t, "zephon_core", parallelism=1,
             options={"prefetch": 0, "reader_threads": 0}),
        case("zephon_core p=1 prefetch=2 (the earlier default)", t, "zephon_core", parallelism=1,
             options={"prefetch": 2}),
        case("zephon 0.2.0 p=1", t, "zephon020", parallelism=1),
        case("zephon 0.2.0 p=2", t, "zephon020", parallelism=2),
        case("zephon 0.2.0 default", t, "zephon020", parallelism=None),
        case("torchdata nw=0", t, "torchdata", num_workers=0),
        case("torchdata nw=2", t, "torchdata", num_workers=2),
        case("grain", t, "grain"),
        case("generator", t, "generator"),
        case("tokenizer alone (texts in memory)", t, "tokenizer_alone"),
    ]


def run(ctx: Context) -> dict:
    return run_rounds(ctx.runner, cases(ctx.base, ctx.quick), ctx.rounds, "P1")


def verdicts(R: dict) -> list[dict]:
    p1 = R.get("P1", {})
    rows = []
    for ref, key in (("zephon 0.2.0 p=1", "P1_vs_zephon020"), ("generator", "P1_vs_generator")):
        zc, zr = p1.get("zephon_core p=1", {}).get("tokens_per_s"), p1.get(ref, {}).get("tokens_per_s")
        if zc and zr:
            v = zc / zr
            cpu = p1["zephon_core p=1"]["tokens_per_cpu_s"] / p1[ref]["tokens_per_cpu_s"]
            name = f"P1 zephon_core p=1 vs {'plain ' if ref == 'generator' else ''}{ref} (tokens/s, wall)"
            rows.append(verdict(name, Target(">=", TARGETS[key], "x"), v, f"{v:.2f}x wall ({cpu:.2f}x per CPU-s)"))
    return rows


def _row(name: str, x: dict, p1: dict, B: dict) -> str:
    z2 = p1.get("zephon 0.2.0 p=1", {}).get("tokens_per_s")
    gen = p1.get("generator", {}).get("tokens_per_s")
    rss = fmt(x["rss_beyond_mb"]) + (f" (+{x['children_rss_mb']:.0f} in workers)" if x.get("children_rss_mb") else "")
    col = before_cell(B, "P1", name, 1e3, ".0f")
    return (f"| {name} | {x['batches_per_s']:.1f} | {x['tokens_per_s'] / 1e3:.0f} ({x['tokens_per_s_min'] / 1e3:.0f}-"
            f"{x['tokens_per_s_max'] / 1e3:.0f}) | {x['tokens_per_cpu_s'] / 1e3:.0f} | "
            f"{fmt(x['tokens_per_s'] / z2 if z2 else None, '.2f')} | "
            f"{fmt(x['tokens_per_s'] / gen if gen else None, '.2f')} | "
            f"{x['ttfb_s'] * 1e3:.0f} | {rss} |{col}")


section = loader_section(
    "P1", "## P1 tokenize + pack + batch, one rank (median of rounds)\n",
    ["loader", "batches/s", "k tokens/s (min-max)", "k tokens per CPU-s", "x zephon 0.2.0 p=1", "x generator",
     "first batch ms", "peak RSS beyond interpreter MB"], "k tokens/s, per CPU-s", _row)


def keep_baseline(part: dict) -> dict:
    return {k: v for k, v in part.items() if k.startswith("zephon_core")}


GOAL = Goal("P1", "tokenize+pack+batch throughput", TARGETS, verdicts, section, run=run, keep_baseline=keep_baseline)
