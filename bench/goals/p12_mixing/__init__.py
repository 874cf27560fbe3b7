"""P12: steered mixtures (issue 34): what TorchTitan's per-source training loss costs a CPU training step
(source_loss.py, this package: each part timed on the real objects, the step from one dp=2 launch), and how many
steps a mixing decision takes to reach the lanes, with ``decide``'s cost (mixing_lag.py: reported, no target)."""

from __future__ import annotations

from goal import Script, Target, script_goal, verdict
from harness import Context, fmt

# New with P12 (issue 34): the per-source loss adds under 1% to the e2e test's CPU training step.
TARGETS = {"P12_loss_share": 0.01}
HERE = "bench/goals/p12_mixing"


def _loss_argv(ctx: Context) -> list[str]:
    return ["--repeats", str(50 if ctx.quick else 200)]


def _lag_argv(ctx: Context) -> list[str]:
    return ["--steps", str(200 if ctx.quick else 400), "--interval", "20"]


SCRIPTS = {"loss": Script(f"{HERE}/source_loss.py", _loss_argv, timeout=900),
           "lag": Script(f"{HERE}/mixing_lag.py", _lag_argv, timeout=900)}


def _ok(R: dict, part: str) -> dict:
    x = R.get("P12", {}).get(part, {})
    return {} if "error" in x else x


def verdicts(R: dict) -> list[dict]:
    x = _ok(R, "loss")
    if x.get("share_of_step") is None:
        return []
    v = x["share_of_step"]
    return [verdict("P12 TorchTitan's per-source loss per rank and step vs the e2e test's CPU step (dp=2)",
                    Target("<=", TARGETS["P12_loss_share"], "x"), v,
                    f"{v:.4f}x ({v * 100:.2f}%: {x['per_step_us']:,.0f} us / {x['step_ms']:,.0f} ms)")]


def _loss_section(x: dict) -> list[str]:
    return ["Per rank and step (median of the repeats, one thread as each torchrun rank has); the step is "
            "TorchTitan's own (`tps`, median of steps 2-6) in a dp=2 launch with `source_loss` on.\n",
            "| part | us |", "|---|---|",
            f"| `label_sources`, 2 batches | {x['label_sources_us']:,.0f} |",
            f"| label comparison of 2 micro-batches, 16 loss calls' cross entropy again and `index_add_` "
            f"| {x['loss_add_us']:,.0f} |",
            f"| `all_reduce` of the `[2, 3]` table over 2 gloo processes, and the `SourceLoss` "
            f"| {x['reduce_us']:,.0f} |",
            f"| total | {x['per_step_us']:,.0f} |",
            f"| TorchTitan's step | {fmt(x['step_ms'] and x['step_ms'] * 1e3, ',.0f')} |", ""]


def _span(r: list[int] | None) -> str:
    return "n/a" if r is None else f"{r[0]}" if r[0] == r[1] else f"{r[0]}-{r[1]}"


def _lag_section(x: dict) -> list[str]:
    lag, c = x["lag"], x["decide_ms"]
    first, every = (_span(lag[k]) for k in ("first_lane_steps", "every_lane_steps"))
    L = [f"configs/data/curriculum_main.toml, {x['lanes']} lanes, a decision every {x['interval']} steps over "
         f"{x['steps']} steps: the first lane trains on a decision's stage {first} steps after it, "
         f"every lane {every} steps after it ({lag['reached_every_lane']} of {lag['decisions']} "
         f"decisions reached every lane in the run); `decide` took {c['median']:.1f} ms (median, max "
         f"{c['max']:.1f} ms) against {x['data_ms_per_step']:.1f} ms of data per step.\n"]
    return L


def section(R: dict, B: dict) -> list[str]:
    if "P12" not in R:
        return []
    L = [f"## P12 steered mixtures ({HERE}/source_loss.py, mixing_lag.py)\n"]
    for part in ("loss", "lag"):
        if "error" in R["P12"].get(part, {"error": "not run"}):
            L.append(f"{SCRIPTS[part].path}: {R['P12'].get(part, {}).get('error', 'not run')}.\n")
    loss, lag = _ok(R, "loss"), _ok(R, "lag")
    if loss:
        L += _loss_section(loss)
    if lag:
        L += _lag_section(lag)
    return L


GOAL = script_goal("P12", "steered mixtures: the per-source loss's cost, a decision's lag",
                   SCRIPTS, TARGETS, verdicts, section)
