"""The docs' code stays true.

```python blocks in README.md and docs/*.md are complete programs: each one is
run from the repository root. ```py blocks are excerpts: every line of one must
be a line of a runnable file in docs/examples/ (which the suite runs itself).
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
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks(kind: str) -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for n, m in enumerate(FENCE.finditer(doc.read_text())):
            if m.group(1) == kind:
                out.append((f"{doc.name}#{n}", m.group(2)))
    return out


@pytest.mark.parametrize("name,code", blocks("python"), ids=[n for n, _ in blocks("python")])
def test_python_block_runs(name, code, tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{name} failed:\n{r.stderr[-2000:]}"


def test_excerpts_are_lines_of_the_examples():
    example_lines = {line.strip() for f in (ROOT / "docs" / "examples").glob("*.py") for line in f.read_text().splitlines()}
    excerpts = blocks("py")
    assert excerpts, "no excerpts found"
    for name, code in excerpts:
        stray = [line for line in code.splitlines() if line.strip() and line.strip() not in example_lines]
        assert not stray, f"{name}: lines not found in docs/examples: {stray}"
