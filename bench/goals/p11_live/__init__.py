"""P11: live elasticity under torchft (issue 32): samples lost and repeated per fault beside torchft's own
``DistributedSampler`` (live_faults.py, this package: real lighthouse, replica groups as processes), what live mode
costs per step at 8 / 256 / 4,096 lanes (live_cost.py), and the time from a replica joining to its first
committed step (from the fault drill's logs)."""

from __future__ import annotations

from goal import Script, Target, script_goal, verdict
from harness import fmt

# New with P11 (issue 32): Zephon loses and repeats nothing at any fault, every committed step equals the
# uninterrupted run's; live mode's per-step work (in process + the table's allreduce) under 1 ms, and under 1% of
# the drill's own measured step at the drill's 12 lanes.
TARGETS = {"P11_lost_repeated": 0.0, "P11_steps_differ": 0.0, "P11_step_us": 1000.0, "P11_step_share": 0.01}
HERE = "bench/goals/p11_live"
SCRIPTS = {"faults": Script(f"{HERE}/live_faults.py", timeout=900), "cost": Script(f"{HERE}/live_cost.py", timeout=900)}
ZEPHON, PEER = "zephon", "torchft-sampler"
DRILL_CONFIG = "12 lanes (the drill's)"


def _ok(R: dict, part: str) -> dict:
    x = R.get("P11", {}).get(part, {})
    return {} if "error" in x else x


def _drill_step_s(R: dict) -> float | None:
    step = _ok(R, "faults").get("runs", {}).get("sync", {}).get(ZEPHON, {}).get("step")
    return step["median_s"] if step else None


def _fault_rows(R: dict) -> list[dict]:
    rows = []
    for mode, runs in _ok(R, "faults").get("runs", {}).items():
        z, p = runs.get(ZEPHON), runs.get(PEER, {})
        if not z:
            continue
        quorum = "sync quorum" if mode == "sync" else "async quorum (init_sync=False)"
        for fault, w in z["windows"].items():
            pw = p.get("windows", {}).get(fault)
            peer = f"; torchft DistributedSampler: {pw['lost']} lost, {pw['repeated']} repeated" if pw else ""
            rows.append(verdict(f"P11 {quorum}, {fault}: Zephon's samples lost + repeated (3 replica groups)",
                                Target("<=", TARGETS["P11_lost_repeated"]), w["lost"] + w["repeated"],
                                f"{w['lost']} lost, {w['repeated']} repeated{peer}"))
        differ = z.get("differs_from_uninterrupted", [])
        rows.append(verdict(f"P11 {quorum}: Zephon's committed steps that differ from an uninterrupted run's",
                            Target("<=", TARGETS["P11_steps_differ"]), len(differ),
                            f"{len(differ)} of {z['all']['steps'][1] + 1}" + (f" ({differ[:6]})" if differ else "")))
    return rows


def _cost_rows(R: dict) -> list[dict]:
    rows = []
    configs = _ok(R, "cost").get("configs", {})
    for name, c in configs.items():
        if name == DRILL_CONFIG:
            continue
        shown = (f"{c['total_us']:,.0f} us (in process {c['in_process_us']:,.0f}, allreduce {c['allreduce_us']:,.0f}; "
                 f"{c['table_bytes']:,} B)")
        rows.append(verdict(f"P11 live mode per step, {name}: exchange + problems + settle + gloo allreduce",
                            Target("<=", TARGETS["P11_step_us"], " us"), c["total_us"], shown))
    step, drill = _drill_step_s(R), configs.get(DRILL_CONFIG)
    if step and drill:
        v = drill["total_us"] / 1e6 / step
        rows.append(verdict("P11 live mode per step at the drill's 12 lanes vs the drill's measured step (sync)",
                            Target("<=", TARGETS["P11_step_share"], "x"), v,
                            f"{v:.3f}x ({drill['total_us']:,.0f} us / {step * 1e3:.0f} ms)"))
    return rows


def verdicts(R: dict) -> list[dict]:
    return _fault_rows(R) + _cost_rows(R)


def _per_step(w: dict) -> str:
    lo, hi = w["per_step"] or (0, 0)
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _codes(codes: dict) -> str:
    return ", ".join(f"r{rid} {code}" for rid, code in codes.items())


def _faults_section(x: dict) -> list[str]:
    L = [f"Fault script ({x['steps']} committed steps, each replica sleeping {x['pace_s']} s after an attempt; "
         "a killed replica exits 1): "
         "replica groups 0, 1, 2 start; 1 is killed at step 3 before the allreduce; 3 joins once step 4 has "
         "committed; 2 is killed at step 7 after the allreduce, before the commit. Zephon: 12 lanes, a sample is "
         "a batch of 2 rows; the sampler: a sample is a document (one row), 2 per replica group per step.\n",
         "| quorum | fault (steps) | Zephon lost / repeated | Zephon samples per step | sampler lost / repeated "
         "| sampler samples per step |", "|---|---|---|---|---|---|"]
    for mode, runs in x["runs"].items():
        z, p = runs.get(ZEPHON, {}), runs.get(PEER, {})
        for fault in x["windows"]:
            zw, pw = z.get("windows", {}).get(fault), p.get("windows", {}).get(fault)
            a, b = zw["steps"] if zw else ("", "")
            zs = f"{zw['lost']} / {zw['repeated']} | {_per_step(zw)}" if zw else "n/a | n/a"
            ps = f"{pw['lost']} / {pw['repeated']} | {_per_step(pw)}" if pw else "n/a | n/a"
            L.append(f"| {mode} | {fault} ({a}-{b}) | {zs} | {ps} |")
        for name, r in ((ZEPHON, z), (PEER, p)):
            if r:
                a = r["all"]
                L.append(f"| {mode} | whole run, {name}: {len(r['committed'])} steps committed, {r['discarded']} "
                         f"attempts discarded, exit status {_codes(r['codes'])} | {a['lost']} / {a['repeated']} "
                         f"| {_per_step(a)} | | |")
    return L + [""]


def _join_section(x: dict) -> list[str]:
    L = ["The joiner (replica 3): its process starts with the others and waits, loaded, until released (once step 4 "
         "has committed); ready = process start to model and data loaded (imports included); the sum is what a cold "
         "start would take.\n",
         "| quorum | loader | process start -> ready | release -> first commit | Manager built -> first commit | "
         "ready + release -> first commit | first committed step (released after) | drill step (median, less pace) |",
         "|---|---|---|---|---|---|---|---|"]
    for mode, runs in x["runs"].items():
        for name, r in runs.items():
            j, s = r.get("join"), r.get("step")
            if j is None:
                L.append(f"| {mode} | {name} | n/a | | | | | |")
                continue
            L.append(f"| {mode} | {name} | {j['ready_s']:.2f} s | {j['release_to_commit_s']:.2f} s | "
                     f"{fmt(j.get('quorum_to_commit_s'), '.2f')} s | {j['start_to_commit_s']:.2f} s | "
                     f"{j['first_committed_step']} ({j['released_after_step']}) | "
                     f"{fmt(s and s['median_s'] * 1e3, '.0f')} ms |")
    return L + [""]


def _cost_section(x: dict, step: float | None) -> list[str]:
    share = f"the drill's measured step ({step * 1e3:.0f} ms, sync)" if step else "the drill's step (not measured)"
    ar = x["allreduce"]
    L = [f"Per replica and step, median of {next(iter(x['configs'].values()))['steps']} steps; allreduce: "
         f"{ar['backend']}, median of {ar['calls']} calls, the slowest rank; the same allreduce of one int64 (any "
         f"collective's floor on this machine) took {fmt(ar.get('floor_us'), ',.0f')} us.\n",
         "| configuration | lanes per slot | table bytes | exchange | problems | settle | in process | gloo allreduce "
         f"| total | share of {share} |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, c in x["configs"].items():
        p = c["parts_us"]
        L.append(f"| {name} | {c['lanes_per_slot']} | {c['table_bytes']:,} | {p['exchange']:,.0f} us | "
                 f"{p['problems']:,.0f} us | {p['settle']:,.0f} us | {c['in_process_us']:,.0f} us | "
                 f"{c['allreduce_us']:,.0f} us | {c['total_us']:,.0f} us | "
                 f"{fmt(step and c['total_us'] / 1e4 / step, '.2f')}% |")
    L.append("\n4,096 lanes in one slot is an extreme (one data-parallel rank per replica group serving every lane); "
             "with 8 ranks per replica group each rank's slot holds 512 lanes, and the 8 slots' allreduces run on "
             "separate process groups at the same time. The 1 ms target is 1% of a 100 ms step; the drill's step "
             "(a tiny model on CPU, gloo on loopback; Zephon's drill trains 12 batches per step, the sampler's 2 "
             "documents per group) is shorter than any real training step. The allreduce figures are of a shared "
             "2-CPU machine running 3 gloo processes, its load average in the run's header.\n")
    return L


def section(R: dict, B: dict) -> list[str]:
    if "P11" not in R:
        return []
    L = [f"## P11 live elasticity under torchft ({HERE}/live_faults.py, live_cost.py)\n"]
    for part, what in (("faults", "the fault script"), ("cost", "the cost")):
        if "error" in R["P11"].get(part, {"error": "not run"}):
            L.append(f"{HERE}/live_{part}.py ({what}): {R['P11'].get(part, {}).get('error', 'not run')}.\n")
    faults, cost = _ok(R, "faults"), _ok(R, "cost")
    if faults:
        L += _faults_section(faults) + _join_section(faults)
    if cost:
        L += _cost_section(cost, _drill_step_s(R))
    return L


GOAL = script_goal("P11", "live elasticity under torchft: faults beside torchft's sampler, per-step cost, joins",
                   SCRIPTS, TARGETS, verdicts, section)
