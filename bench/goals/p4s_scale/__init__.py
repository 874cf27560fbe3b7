"""P4S: checkpoint aggregation at cluster scale (aggregate_scale.py, this package: simulated and real ranks, 2 CPUs
for all).

``--only P4S`` runs the cases on a folder; ``--only P4S3`` the 16,384-rank one on the loopback S3 server.
"""

from __future__ import annotations

from goal import Goal, Target, verdict
from harness import Context, fmt, log
from measure import emit

TARGETS = {"P4S_512_processes_s": 1.0, "P4S_16k_local_s": 3.0, "P4S_16k_s3_s": 10.0, "P4S_ops_per_rank": 5.0,
           "P4S_16k_many_lanes_local_s": 10.0}
# name -> aggregate_scale.py's arguments. 16,384 ranks as TorchTitan lays out Llama-3 405B's 16k GPUs
# (tp 8, pp 16, dp 128: 128 lanes), and as a job without pipeline stages lays them out (tp 8, pp 1, dp 2,048:
# 2,048 lanes, a merged state 16 times as large, which every rank reads: the bytes read per checkpoint grow
# with ranks x lanes); real processes with every rank its own dp group (every rank writes: the heaviest
# case) and with tp 8. On s3 the ranks' looks are paced for 150 requests a second, what moto serves on 2
# cores beside the ranks (the default is sized for S3's 5,500 a second per prefix), and the first round
# (16,384 writers) takes many minutes on moto: hence the long timeout.
CASES = {
    "16384 simulated, local": ["--ranks", "16384", "--tp", "8", "--pp", "16", "--processes", "4", "--rounds", "4"],
    "16384 simulated, local, tp 8 pp 1 (2048 lanes)": ["--ranks", "16384", "--tp", "8", "--pp", "1", "--processes", "4",
                                                       "--rounds", "3", "--timeout", "900", "--check-each"],
    "4096 simulated, local, tp 8 pp 1 (512 lanes)": ["--ranks", "4096", "--tp", "8", "--pp", "1", "--processes", "4",
                                                     "--rounds", "3"],
    "16384 simulated, s3 +20 ms": ["--ranks", "16384", "--tp", "8", "--pp", "16", "--processes", "16", "--rounds", "3",
                                   "--backend", "s3", "--latency-ms", "20", "--follow-budget", "150",
                                   "--timeout", "1500"],
    "64 processes, dp 64": ["--ranks", "64", "--tp", "1", "--pp", "1", "--mode", "processes", "--rounds", "4"],
    "256 processes, dp 256": ["--ranks", "256", "--tp", "1", "--pp", "1", "--mode", "processes", "--rounds", "4"],
    "512 processes, dp 512": ["--ranks", "512", "--tp", "1", "--pp", "1", "--mode", "processes", "--rounds", "4"],
    "512 processes, tp 8 dp 64": ["--ranks", "512", "--tp", "8", "--pp", "1", "--mode", "processes", "--rounds", "4"],
}


def case_aggregate_scale(a: dict) -> None:
    """aggregate_scale.py with the command-line arguments ``a["argv"]``: simulated ranks at cluster scale."""
    from goals.p4s_scale import aggregate_scale

    emit(aggregate_scale.run(aggregate_scale.parse(a["argv"])))


def _wanted(name: str, ctx: Context) -> bool:
    local, s3 = "P4S" in ctx.only, "P4S3" in ctx.only
    if ("s3" in name and not s3) or ("s3" not in name and not local):
        return False
    return not (ctx.quick and ("16384" in name or "4096" in name or name.startswith("512")))


def run(ctx: Context) -> dict:
    """The cases ``--only`` asks for: P4S those on a folder, P4S3 the one on S3 (about 30 min on 2 cores)."""
    out = {}
    for name, argv in CASES.items():
        if not _wanted(name, ctx):
            continue
        argv = [*argv, "--dir", str(ctx.work / "aggregate-scale")]
        res = ctx.runner.case("project", "aggregate_scale", {"argv": argv}, timeout=3000 if "s3" in name else 900,
                              label=f"P4S {name}")
        out[name] = res
        for x in res.get("rounds", []):
            shown = (f"{x['latency_s']:.2f} s, {x['ops_per_rank_mean']:.2f} ops/rank, {x['writers']} writers"
                     if not x["error_count"] else f"{x['error_count']} errors: {x['errors'][:1]}")
            log(f"  P4S {name:28s} round {x['round']}: {shown}")
    return out


def warm(res: dict) -> dict | None:
    """The median warm round (rounds after the first: only representatives write) of a case, or None."""
    rounds = [x for x in res.get("rounds", [])[1:] if not x["error_count"]]
    if not rounds:
        return None
    return sorted(rounds, key=lambda x: x["latency_s"])[len(rounds) // 2]


def verdicts(R: dict) -> list[dict]:
    p4s = R.get("P4S", {})
    rows = []
    for name, key in (("512 processes, dp 512", "P4S_512_processes_s"), ("16384 simulated, local", "P4S_16k_local_s"),
                      ("16384 simulated, local, tp 8 pp 1 (2048 lanes)", "P4S_16k_many_lanes_local_s"),
                      ("16384 simulated, s3 +20 ms", "P4S_16k_s3_s")):
        w = warm(p4s.get(name, {}))
        if w:
            rows.append(verdict(f"P4S aggregation {name} (warm median; 2 CPUs)", Target("<=", TARGETS[key], " s"),
                                w["latency_s"], f"{w['latency_s']:.2f} s"))
    for name in ("16384 simulated, local", "16384 simulated, local, tp 8 pp 1 (2048 lanes)",
                 "16384 simulated, s3 +20 ms", "512 processes, dp 512"):
        res = p4s.get(name, {})
        w = warm(res)
        if w:
            v = w["ops_per_rank_mean"]
            rows.append(verdict(f"P4S metadata operations per rank per checkpoint, {name} (warm)",
                                Target("<=", TARGETS["P4S_ops_per_rank"]), v,
                                f"{v:.2f} ({w['bytes_read_per_rank'] / 1e3:.1f} kB read, "
                                f"{w['bytes_read_per_rank'] * res['ranks'] / 1e6:.0f} MB a checkpoint; "
                                f"{w['bytes_written_per_rank']:.0f} B written)"))
    return rows


def _rows(name: str, res: dict) -> list[str]:
    L = []
    for x in res.get("rounds", []):
        if x["error_count"]:
            L.append(f"| {name} | {x['round']} | errors: {x['errors'][:1]} | | | | | | | |")
            continue
        srv = x.get("server_requests_per_rank", {}).get("requests")
        per_checkpoint = x["bytes_read_per_rank"] * res["ranks"] / 1e6 if "ranks" in res else None
        L.append(f"| {name} | {x['round']} | {x['latency_s']:.2f} | {x['cpu_s']:.1f} | {x['writers']} | "
                 f"{x['ops_per_rank_mean']:.2f} ({x['ops_per_rank_max']}) | {x['bytes_read_per_rank'] / 1e3:.1f} | "
                 f"{fmt(per_checkpoint, '.0f')} | {x['bytes_written_per_rank']:.0f} | {fmt(srv, '.2f')} |")
    if "error" in res:
        L.append(f"| {name} | | {res['error']} | | | | | | | |")
    return L


def section(R: dict, B: dict) -> list[str]:
    if not R.get("P4S"):
        return []
    L = ["## P4S checkpoint aggregation at cluster scale (bench/goals/p4s_scale/aggregate_scale.py; 2 CPUs for every "
         "rank)\n"]
    L.append("Round 1 is a launch's first checkpoint (every rank writes); later rounds, only each dp group's "
             "representative. Latency: last rank done - first rank's call. Operations and bytes: per rank per "
             "checkpoint (zephon_dev/fsops.py).\n")
    L.append("| case | round | latency s | CPU s | writers | metadata ops / rank (max) | kB read / rank | "
             "MB read / checkpoint | B written / rank | S3 requests / rank |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for name, res in R["P4S"].items():
        L += _rows(name, res)
    return L + [""]


GOAL = Goal("P4S", "aggregation at cluster scale", TARGETS, verdicts, section, run=run,
            cases={"aggregate_scale": case_aggregate_scale}, selected_by=("P4S3",))
