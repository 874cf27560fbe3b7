"""What a run reports: the verdicts, results.md, and the headline block of docs/performance.md.

All three are made from a results dict (``bench/results/results.json``) and the goal registry alone, so
``bash bench/run.sh --report-only`` rewrites them from a stored run, and a test checks that the headline
block in docs/performance.md is what this module makes of the committed results.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import determinism
from goal import Goal
from goals import REGISTRY
from harness import BATCH, ROOT, SEQ_LEN

PERFORMANCE_MD = ROOT / "docs" / "performance.md"
HEADLINE_START, HEADLINE_END = "<!-- bench:results:begin -->", "<!-- bench:results:end -->"


def verdict_rows(R: dict) -> list[tuple[Goal, dict]]:
    """Every goal's verdicts for the results ``R``, with the goal that owns each."""
    return [(g, v) for g in REGISTRY for v in g.verdicts(R)]


def verdicts(R: dict) -> list[dict]:
    """Goal verdicts for zephon_core as checked out (the same names for every run, so that a
    baseline run's verdicts line up with them)."""
    return [v for _, v in verdict_rows(R)]


def load_baseline(path: Path | None) -> dict | None:
    if path is None or not path.exists():
        return None
    B = json.loads(path.read_text())
    B["goals"] = verdicts(B)
    try:
        B["file"] = str(path.resolve().relative_to(ROOT))
    except ValueError:
        B["file"] = str(path)
    return B


def baseline_summary(B: dict | None) -> dict | None:
    """What results.json keeps of the baseline run: its goals and what each goal keeps of its own part (for the
    "before" columns of results.md and the plots)."""
    if B is None:
        return None
    out: dict[str, Any] = {
        "file": B.get("file"),
        "note": B.get("note", ""),
        "commit": B["machine"]["git_commit"],
        "loadavg_start": B["machine"]["loadavg_start"],
        "loadavg_end": B.get("loadavg_end"),
        "goals": B["goals"],
    }
    for g in REGISTRY:
        if g.keep_baseline is not None:
            out[g.store] = g.keep_baseline(B.get(g.store, {}))
    return out


def _header(R: dict, B: dict) -> list[str]:
    m = R["machine"]
    pe, ce = m.get("project_env", {}), m.get("peers_env", {})
    L = ["# Zephon benchmark results\n"]
    L.append(f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']} RAM, Linux {m['kernel']}; "
             f"Python {pe.get('python')}; zephon_core @ {m['git_commit']}"
             f"{' (modified)' if m['zephon_core_modified'] else ''}.  ")
    quick = "quick smoke run, " if R.get("quick") else ""
    L.append(f"Command: `{R['command']}` ({quick}{R.get('rounds')} round(s)).  ")
    L.append(f"Load average (1/5/15 min): start {'/'.join(f'{x:.1f}' for x in m['loadavg_start'])}, "
             f"end {'/'.join(f'{x:.1f}' for x in R['loadavg_end'])}; total wall {R['wall_s'] / 60:.1f} min.  ")
    L.append("Project env: " + ", ".join(f"{k} {v}" for k, v in pe.items() if k != "python") + ".  ")
    L.append("Peers env: " + ", ".join(f"{k} {v}" for k, v in ce.items() if k != "python") + ".  ")
    if B:
        L.append(f"Baseline (\"before\" columns): `{B.get('file')}`, zephon_core @ {B.get('commit', '')}"
                 f"{' - ' + B['note'] if B.get('note') else ''}; its load average {B['loadavg_start'][0]:.1f} at the "
                 f"start, {B['loadavg_end'][0]:.1f} at the end.  ")
    c = R.get("corpus", {})
    if c:
        L.append(f"Corpus: {c['documents']} documents, {c['characters'] / 1e6:.1f} M characters, "
                 f"{c['pretokenized_tokens'] / 1e6:.2f} M tokens ({c['mean_tokens_per_document']:.0f} "
                 f"tokens/document); seq_len {SEQ_LEN}, batch {BATCH} (4096 tokens per batch).\n")
    return L


def _goals_table(R: dict, B: dict) -> list[str]:
    before = {g["goal"]: g for g in B.get("goals", [])}
    L = ["## Goals\n", "| goal | target | measured | verdict |" + (f" before ({B.get('commit', '')}) |" if B else ""),
         "|---|---|---|---|" + ("---|" if B else "")]
    for g in verdicts(R):
        b = before.get(g["goal"])
        col = (f" {b['measured']} ({'PASS' if b['pass'] else 'FAIL'}) |" if b else " - |") if B else ""
        L.append(f"| {g['goal']} | {g['target']} | {g['measured']} | {'PASS' if g['pass'] else 'FAIL'} |{col}")
    return L + [""]


def markdown(R: dict) -> str:
    """results.md: the setting, the goals table, the determinism line, then every goal's section."""
    B = R.get("baseline") or {}
    L = _header(R, B) + _goals_table(R, B) + determinism.section(R)
    for g in REGISTRY:
        L += g.section(R, B)
    return "\n".join(L) + "\n"


def headline(R: dict) -> str:
    """The headline block of docs/performance.md, markers included: the run (date, command, commit, machine,
    load, versions), then one row per goal target with the command that measures it, then the determinism line."""
    m = R["machine"]
    pe, ce = m.get("project_env", {}), m.get("peers_env", {})
    run = (f"`{R['command']}`{' (quick smoke run)' if R.get('quick') else ''}, {R.get('date') or 'date not recorded'}"
           f", {R.get('rounds')} round(s), {R['wall_s'] / 60:.1f} min; zephon_core @ {m['git_commit']}"
           f"{' (modified)' if m.get('zephon_core_modified') else ''}; {m['nproc']} CPUs ({m['cpu']}), {m['memory']}; "
           f"load average {m['loadavg_start'][0]:.1f} at the start and {R['loadavg_end'][0]:.1f} at the end")
    L = [HEADLINE_START,
         "<!-- Generated by bench/run.py from bench/results/results.json (every run, and --report-only): edit the "
         "goal modules in bench/goals, never this block. -->", "",
         f"Run: {run}.  ",
         f"Python {pe.get('python')}. Project env: " + ", ".join(f"{k} {v}" for k, v in pe.items() if k != "python")
         + ". Peers env: " + ", ".join(f"{k} {v}" for k, v in ce.items() if k != "python") + ".", "",
         "| goal | target | measured | verdict | command |", "|---|---|---|---|---|"]
    rows = verdict_rows(R)
    for g, v in rows:
        L.append(f"| {v['goal']} | {v['target']} | {v['measured']} | {'PASS' if v['pass'] else 'FAIL'} | `{g.how}` |")
    if not rows:
        L.append("| (this run measured no goal) | | | | |")
    passed = sum(1 for _, v in rows if v["pass"])
    L += ["", f"{passed} of {len(rows)} goal rows pass.", ""]
    L += [line.rstrip("\n") for line in determinism.section(R)] + [HEADLINE_END]
    return "\n".join(L)


def replace_headline(text: str, block: str) -> str:
    """``text`` with its headline block (markers included) replaced by ``block``."""
    start, end = text.find(HEADLINE_START), text.find(HEADLINE_END)
    if start < 0 or end < start:
        raise ValueError(f"no {HEADLINE_START} ... {HEADLINE_END} block")
    return text[:start] + block + text[end + len(HEADLINE_END):]


def current_headline(text: str) -> str:
    start, end = text.find(HEADLINE_START), text.find(HEADLINE_END)
    return text[start : end + len(HEADLINE_END)] if 0 <= start < end else ""


def write_headline(R: dict, path: Path = PERFORMANCE_MD) -> bool:
    """Rewrite only the headline block of ``path``; False where it has none."""
    text = path.read_text()
    if not current_headline(text):
        return False
    path.write_text(replace_headline(text, headline(R)))
    return True
