"""P4: checkpoint aggregation latency, one forked process per rank, on a folder and on two loopback S3 servers."""

from __future__ import annotations

import shutil

from goal import Goal, Target, row, verdict
from harness import Context, fmt, log

from goals.p4_aggregation import aggregate_ranks

# P4_8_ranks_ms holds on a folder, where a store call takes microseconds. On an object store a round is
# counted in the store's own round trips (its median read and write, measured in the same run after the
# rounds): an absolute figure would measure the server (moto: 3-8 ms a call on 2 cores, S3: 10-30 ms).
# The floor is FLOOR_ROUND_TRIPS one after another: a writer puts its part, the leader reads the parts,
# puts the merged state, a rank reads it. Above it: the pauses between looks (``folder.Pacing``), by design.
TARGETS = {"P4_8_ranks_ms": 50.0, "P4_64_ranks_ms": 1500.0, "P4_8_ranks_s3_round_trips": 20.0}
FLOOR_ROUND_TRIPS = 4
SHOWN_OPS = ("names", "get", "get_many", "put", "remove", "sleep")
# results.json key -> label. "s3" is moto's server (the tests' one; a single Python process, so its CPU
# cost is in the numbers), "s3rver" a node S3 server (bench/run.sh installs it).
BACKENDS = {"local": "local", "s3": "s3 (moto)", "s3rver": "s3 (s3rver)"}


def _logged(name: str, res: dict) -> None:
    for n, x in res.get("per_ranks", {}).items():
        if x.get("errors"):
            log(f"  P4 {name} ranks={n}: ERRORS {x['errors'][:2]}")
        else:
            log(f"  P4 {BACKENDS[name]:14s} ranks={n:>2s}: warm {x['warm_ms']:8.1f} ms  "
                f"first {x['first_round_ms']:8.1f} ms  (spawn+rounds {x['spawn_s']:.1f}s)")


def run(ctx: Context) -> dict:
    q = ctx.quick
    out = {}
    for name in BACKENDS:
        if name == "s3rver" and not ctx.s3rver:
            log("  P4 s3rver: not installed (bench/run.sh installs it with npm; needs node), skipped")
            out[name] = {"error": "s3rver not installed (needs node and npm)"}
            continue
        local_dir = ctx.work / "aggregate"  # the folder, or s3rver's object store
        if local_dir.exists():
            shutil.rmtree(local_dir)
        args = {"backend": name, "ranks": [2, 8] if q else [2, 8, 32, 64], "rounds": 2 if q else 3,
                "local_dir": str(local_dir), "s3rver": ctx.s3rver}
        out[name] = ctx.runner.case("project", "aggregate", args, timeout=480, label=f"P4 {name}")
        _logged(name, out[name])
    return out


def round_trip_ms(res: dict) -> float | None:
    """One store round trip in this run: the mean of its median read and median write (after the rounds)."""
    sl = res.get("store_latency_ms") or {}
    rw = [sl[k] for k in ("read", "write (atomic publish)") if k in sl]
    return sum(rw) / len(rw) if rw else None


def round_trips(res: dict, n: str) -> float | None:
    """A warm round of ``n`` ranks in store round trips (floor: FLOOR_ROUND_TRIPS)."""
    y, rt = res.get("per_ranks", {}).get(n, {}), round_trip_ms(res)
    return y["warm_ms"] / rt if rt and "warm_ms" in y else None


def verdicts(R: dict) -> list[dict]:
    p4 = R.get("P4", {})
    rows = []
    for backend, label in BACKENDS.items():  # one verdict per server: moto's numbers include its own CPU cost
        pr = p4.get(backend, {}).get("per_ranks", {})
        if backend != "local" and (k := round_trips(p4.get(backend, {}), "8")) is not None:
            rows.append(verdict(f"P4 aggregation 8 ranks, {label}, in store round trips (warm median; floor "
                                f"{FLOOR_ROUND_TRIPS})", Target("<=", TARGETS["P4_8_ranks_s3_round_trips"]), k,
                                f"{k:.0f} ({pr['8']['warm_ms']:.0f} ms / {round_trip_ms(p4[backend]):.1f} ms)"))
        for n, key in (("8", "P4_8_ranks_ms"), ("64", "P4_64_ranks_ms")):
            if n == "8" and backend != "local":
                continue  # counted in round trips above
            y, target = pr.get(n), Target("<=", TARGETS[key], " ms")
            if y and "warm_ms" in y:
                rows.append(verdict(f"P4 aggregation {n} ranks, {label} (warm median)", target, y["warm_ms"],
                                    f"{y['warm_ms']:.0f} ms"))
            elif y or p4.get(backend, {}).get("error"):
                shown = "error" if y else p4[backend]["error"]
                rows.append(row(f"P4 aggregation {n} ranks, {label}", str(target), None, False, shown))
    return rows


def _latency_table(R: dict, B: dict) -> list[str]:
    bc = B.get("commit", "")
    per = {b: R["P4"].get(b, {}).get("per_ranks", {}) for b in BACKENDS}
    before = {b: B.get("P4", {}).get(b, {}).get("per_ranks", {}) for b in BACKENDS}
    shown_before = [b for b in BACKENDS if before[b]]
    L = ["| ranks | " + " | ".join(f"{BACKENDS[b]} warm ms | {BACKENDS[b]} first round ms" for b in BACKENDS) + " |"
         + "".join(f" before ({bc}): {BACKENDS[b]} warm ms |" for b in shown_before)]
    L.append("|---|" + "---|---|" * len(BACKENDS) + "---|" * len(shown_before))
    for n in sorted(set().union(*per.values()), key=int):
        at = {b: per[b].get(n, {}) for b in BACKENDS}
        cells = [f"{fmt(at[b].get('warm_ms'), '.0f')} | {fmt(at[b].get('first_round_ms'), '.0f')}" for b in BACKENDS]
        L.append(f"| {n} | " + " | ".join(cells) + " |"
                 + "".join(f" {fmt(before[b].get(n, {}).get('warm_ms'), '.0f')} |" for b in shown_before))
    L.append("")
    for backend, label in BACKENDS.items():
        res = R["P4"].get(backend, {})
        sl = res.get("store_latency_ms")
        if sl:
            trips = ", ".join(f"{n} ranks {fmt(round_trips(res, n), '.0f')}"
                              for n in sorted(res.get("per_ranks", {}), key=int))
            in_trips = "" if backend == "local" else (
                f"; a warm round in round trips of {round_trip_ms(res):.1f} ms (floor {FLOOR_ROUND_TRIPS}): {trips}")
            L.append(f"Single store call latency, {label} (median, measured after the runs): "
                     + ", ".join(f"{k} {v:.1f} ms" for k, v in sl.items()) + in_trips + ".  ")
        elif R["P4"].get(backend, {}).get("error"):
            L.append(f"{label}: {R['P4'][backend]['error']}.  ")
    return L + [""]


def _trace_table(R: dict, B: dict) -> list[str]:
    L = ["Where a warm round's time goes (store calls and sleeps between polls; calls / ms per round; "
         "followers averaged):\n"]
    L.append("| backend | ranks | role | " + " | ".join(SHOWN_OPS) + " |")
    L.append("|---|---|---|" + "---|" * len(SHOWN_OPS))
    sets = [(label, R["P4"].get(b, {})) for b, label in BACKENDS.items()]
    sets += [(f"{BACKENDS[b]} before ({B.get('commit', '')})", B["P4"][b]) for b in ("s3", "s3rver")
             if B.get("P4", {}).get(b)]
    for label, data in sets:
        for n, x in data.get("per_ranks", {}).items():
            for role in ("leader", "follower_mean"):
                t = x.get("trace_last_round", {}).get(role)
                if t:
                    L.append(f"| {label} | {n} | {role.split('_')[0]} | " + " | ".join(
                        f"{t[o]['calls']:.1f} / {t[o]['ms']:.0f}" if o in t else "-" for o in SHOWN_OPS) + " |")
    return L + [""]


def section(R: dict, B: dict) -> list[str]:
    if "P4" not in R:
        return []
    head = "## P4 checkpoint aggregation (one forked process per rank; latency = last rank done - first rank started)\n"
    return [head, *_latency_table(R, B), *_trace_table(R, B)]


def keep_baseline(part: dict) -> dict:
    keep = ("warm_ms", "first_round_ms", "trace_last_round")
    return {b: {"per_ranks": {n: {k: x[k] for k in keep if k in x} for n, x in v.get("per_ranks", {}).items()},
                "store_latency_ms": v.get("store_latency_ms")} for b, v in part.items()}


GOAL = Goal("P4", "aggregation latency", TARGETS, verdicts, section, run=run,
            cases={"aggregate": aggregate_ranks.case_aggregate}, keep_baseline=keep_baseline)
