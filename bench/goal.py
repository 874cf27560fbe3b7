"""What a goal declares (``GOAL = Goal(...)`` in its package's __init__.py, bench/goals/<goal>/), and the slot for
standalone benchmark scripts.

A goal owns

* ``key``: its name in ``--only`` and in results.json (``R[key]``, or ``R[result_key]``);
* ``targets``: its entries of ``GOALS`` (results.json's ``goals_targets``), by name;
* ``run(ctx)``: what it measures, through ``ctx.runner`` (``Runner.case`` / ``Runner.script``); its return value
  is stored as ``R[key]``. ``None`` for a goal read off other goals' results (P6 reads P1's processes);
* ``cases``: the ``bench/cases.py`` entry points it defines, by case name (``python bench/cases.py NAME JSON``);
* ``verdicts(R)``: its rows of the goals table (``row(...)``), from a results dict, this run's or the baseline's;
* ``section(R, B)``: its section of results.md (markdown lines; ``B``: the baseline summary, or ``{}``);
* ``keep_baseline(part)``: what results.json keeps of a baseline run's ``R[key]`` for the "before" columns;
* ``command``: the command that measures it (the headline table of docs/performance.md shows it).

``script_goal`` makes a goal of standalone scripts that each print one ``RESULT {json}`` line
(stats_overhead.py for P9, the format_*.py for P10: each in its goal's package, bench/goals/<goal>/).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness import Context, log


def row(goal: str, target: str, value: float | None, ok: bool | None, shown: str) -> dict:
    """One verdict: the goal's name (the same in every run, so that a baseline's rows line up), its target as
    shown, the measured value, whether it passes, and the measured value as shown."""
    return {"goal": goal, "target": target, "value": value, "pass": ok, "measured": shown}


@dataclass(frozen=True)
class Target:
    """A bound on a measured value: ``Target("<=", TARGETS[key], " ms")``. The target a row shows and the check
    it passes are made from the one number in the goal's ``TARGETS``, so the two cannot drift apart."""

    op: str  # "<=" or ">="
    limit: float
    unit: str = ""

    def __str__(self) -> str:
        return f"{self.op} {self.limit:g}{self.unit}"

    def met(self, value: float) -> bool:
        return value <= self.limit if self.op == "<=" else value >= self.limit


def verdict(goal: str, target: Target, value: float, shown: str) -> dict:
    """``row`` for a measured value against ``target``."""
    return row(goal, str(target), value, target.met(value), shown)


def no_verdicts(R: dict) -> list[dict]:
    return []


def loader_table(title: str, header: list[str], before: str, rows: dict[str, dict], B: dict,
                 render: Callable[[str, dict], str]) -> list[str]:
    """A section's table of one row per loader (P1-P3): ``header``'s columns, then, with a baseline ``B``, one
    "before" column headed ``before``; ``render(name, x)`` makes a measured row, a failed one says its error."""
    more = bool(B)
    L = [title, "| " + " | ".join(header) + " |" + (f" before ({B.get('commit', '')}): {before} |" if more else ""),
         "|" + "---|" * (len(header) + more)]
    for name, x in rows.items():
        if "error" in x:
            L.append(f"| {name} | error: {x['error']} |" + "|" * (len(header) - 2) + ("|" if more else ""))
        else:
            L.append(render(name, x))
    return L + [""]


def before_cell(B: dict, key: str, name: str, scale: float, spec: str, kept: bool = True) -> str:
    """A loader row's "before" cell: the baseline's tokens/s and tokens per CPU-s of ``name`` in ``R[key]``, over
    ``scale`` and formatted by ``spec``; "-" where the baseline has no such row (or ``kept`` is false); no cell
    at all without a baseline."""
    if not B:
        return ""
    b = B.get(key, {}).get(name, {})
    if not kept or "tokens_per_s" not in b:
        return " - |"
    return f" {b['tokens_per_s'] / scale:{spec}}, {b['tokens_per_cpu_s'] / scale:{spec}} |"


def loader_section(key: str, title: str, header: list[str], before: str,
                   render: Callable[[str, dict, dict, dict], str]) -> Callable[[dict, dict], list[str]]:
    """A goal's ``section``: its ``loader_table`` of ``R[key]``, each row ``render(name, x, R[key], B)``."""

    def section(R: dict, B: dict) -> list[str]:
        if key not in R:
            return []
        return loader_table(title, header, before, R[key], B, lambda name, x: render(name, x, R[key], B))

    return section


@dataclass(frozen=True)
class Goal:
    key: str
    title: str
    targets: dict[str, float]
    verdicts: Callable[[dict], list[dict]]
    section: Callable[[dict, dict], list[str]]
    run: Callable[[Context], Any] | None = None
    cases: dict[str, Callable[[dict], None]] = field(default_factory=dict)
    selected_by: tuple[str, ...] = ()  # the --only names that run it (besides key)
    result_key: str = ""  # where results.json holds it, when not under key
    keep_baseline: Callable[[Any], Any] | None = None
    command: str = ""
    default: bool = True  # measured by a plain `bash bench/run.sh` (else only when --only names it)

    @property
    def store(self) -> str:
        return self.result_key or self.key

    @property
    def how(self) -> str:
        return self.command or f"bash bench/run.sh --only {self.key}"

    def selected(self, only: set[str]) -> bool:
        return self.run is not None and bool({self.key, *self.selected_by} & only)


@dataclass(frozen=True)
class Script:
    """A standalone benchmark script: ``path`` (from the repository root) and its arguments for a run."""

    path: str
    argv: Callable[[Context], list[str]] = lambda ctx: ["--work", str(ctx.work), *(["--quick"] if ctx.quick else [])]
    venv: str = "project"
    timeout: float = 1800.0


def _flat(res: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """A result's scalar fields (and short lists), nested dicts as dotted names."""
    out: list[tuple[str, Any]] = []
    for k, v in res.items():
        if k in ("wall_s", "load_start", "loadavg", "stderr"):
            continue
        if isinstance(v, dict):
            out += _flat(v, f"{prefix}{k}.")
        elif isinstance(v, (str, int, float, bool)) or v is None:
            out.append((prefix + k, v))
        elif isinstance(v, list) and len(v) <= 6 and all(isinstance(x, (str, int, float)) for x in v):
            out.append((prefix + k, v))
    return out


def _shown(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return ", ".join(_shown(x) for x in v)
    return json.dumps(v) if v is None or isinstance(v, bool) else str(v)


def results_table(results: dict[str, dict]) -> list[str]:
    """Every script's RESULT fields, one row each (a script's own section can do better)."""
    lines = ["| script | field | value |", "|---|---|---|"]
    for name, res in results.items():
        if "error" in res:
            lines.append(f"| {name} | error | {res['error']} |")
            continue
        lines += [f"| {name} | `{k}` | {_shown(v)} |" for k, v in _flat(res)]
    return lines + [""]


def script_goal(key: str, title: str, scripts: Script | dict[str, Script], targets: dict[str, float] | None = None,
                verdicts: Callable[[dict], list[dict]] = no_verdicts,
                section: Callable[[dict, dict], list[str]] | None = None, **kw: Any) -> Goal:
    """A goal that runs standalone scripts, each printing one ``RESULT {json}`` line.

    One ``Script``: ``R[key]`` is its result. A dict of them: ``R[key][name]`` is each one's. Without a
    ``section``, results.md shows every script's fields in one table (``results_table``).
    """

    def run(ctx: Context) -> dict:
        many = scripts if isinstance(scripts, dict) else {"": scripts}
        out = {}
        for name, s in many.items():
            label = f"{key} {name or s.path}"
            out[name] = ctx.runner.script(s.venv, s.path, s.argv(ctx), timeout=s.timeout, label=label)
            log(f"  {label}: " + (out[name]["error"] if "error" in out[name] else f"{out[name]['wall_s']:.1f} s"))
        return out if isinstance(scripts, dict) else out[""]

    def default_section(R: dict, B: dict) -> list[str]:
        res = R.get(key)
        if not res:
            return []
        named = res if isinstance(scripts, dict) else {scripts.path: res}
        return [f"## {key} {title}\n", *results_table(named)]

    return Goal(key, title, targets or {}, verdicts, section or default_section, run=run, **kw)
