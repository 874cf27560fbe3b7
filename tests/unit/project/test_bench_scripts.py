"""The bench scripts that the docs show still start as the docs run them.

A full benchmark takes minutes, so test_documented_commands.py exempts them; this keeps their command lines
honest without measuring: every bench script a doc names (``bench/goals/<goal>/<script>.py``, ...) answers
``--help`` with the environment the doc gives it, and every ``bench/cases.py CASE`` a doc names is a case that
``bench/cases.py`` knows.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SCRIPT = re.compile(r"(?:PYTHONPATH=(\S+) )?\$ZEPHON_PY (bench/[a-z0-9_/]+\.py)(?: (\S+))?")


def _documented() -> dict[str, set[str | None]]:
    """Each bench script a doc runs -> the PYTHONPATH values the docs give it (None: none)."""
    found: dict[str, set[str | None]] = {}
    for doc in DOCS:
        for pythonpath, script, _ in SCRIPT.findall(doc.read_text()):
            found.setdefault(script, set()).add(pythonpath or None)
    return found


def _run(argv: list[str], pythonpath: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_docs_run_bench_scripts() -> None:
    # The pattern must keep finding them, or the tests below would pass on nothing.
    assert {"bench/cases.py", "bench/goals/p4s_scale/aggregate_scale.py",
            "bench/goals/study_curriculum/curriculum.py"} <= set(_documented())


@pytest.mark.parametrize("script", sorted(s for s in _documented() if s != "bench/cases.py"))
def test_a_documented_bench_script_starts_with_the_environment_the_docs_give_it(script: str) -> None:
    for pythonpath in sorted(_documented()[script], key=str):
        p = _run([script, "--help"], pythonpath)
        assert p.returncode == 0 and "usage" in p.stdout, f"{script} (PYTHONPATH={pythonpath}): {p.stderr[-800:]}"


def test_every_documented_case_is_one_that_bench_cases_knows() -> None:
    named = {case for doc in DOCS for pp, script, case in SCRIPT.findall(doc.read_text()) if script == "bench/cases.py"}
    assert named, "no doc runs bench/cases.py any more: drop this test"
    p = _run(["bench/cases.py"], ".")
    known = set(re.findall(r"[a-z_]+", p.stderr.split("CASE:", 1)[-1]))
    assert p.returncode != 0 and known, p.stderr[-800:]
    assert named <= known, f"the docs name cases bench/cases.py does not have: {sorted(named - known)}"
