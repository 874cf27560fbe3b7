"""Lines are at most 120 columns (ruff's `line-length`). Files written under the old 170-column limit are
listed in pyproject.toml's per-file-ignores with E501 until someone shortens them; these tests keep that
list shrinking (a listed file must still have a long line) and hold new and changed lines to 120 columns
everywhere, listed files included (against `LIMIT_SINCE`, the commit before the limit came in)."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LIMIT = 120
LIMIT_SINCE = "e39a3f2"  # main's last commit under the 170-column limit
SKIPPED = ("zephon_dev/s3rver/", "bench/results/", "bench/.work/")


def _ruff() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]


def _exempt() -> list[str]:
    return sorted(f for f, codes in _ruff()["lint"]["per-file-ignores"].items() if "E501" in codes)


def test_the_limit_is_120_columns_and_exemptions_name_single_files():
    assert _ruff()["line-length"] == LIMIT
    globs = [f for f in _exempt() if any(c in f for c in "*?[")]
    assert not globs, f"E501 exemptions must name files, not patterns (new files are held to {LIMIT}): {globs}"


def test_every_exempt_file_exists_and_still_has_a_long_line():
    fixed = []
    for name in _exempt():
        path = ROOT / name
        assert path.is_file(), f"pyproject.toml exempts {name} from E501, which does not exist: take it off the list"
        if all(len(line) <= LIMIT for line in path.read_text().splitlines()):
            fixed.append(name)
    assert not fixed, f"no line over {LIMIT} columns left in {fixed}: take them off pyproject.toml's E501 list"


def _long_added_lines(diff: str) -> list[str]:
    """``file:line: length`` of every added line over the limit in a ``git diff -U0`` of Python files."""
    found, current, line_no = [], "", 0
    for line in diff.splitlines():
        if line.startswith("+++ "):
            current = line[6:] if line.startswith("+++ b/") else ""
        elif line.startswith("@@"):
            line_no = int(line.split("+")[1].split()[0].split(",")[0])
        elif line.startswith("+") and current:
            if len(line) - 1 > LIMIT and not current.startswith(SKIPPED):
                found.append(f"{current}:{line_no}: {len(line) - 1} columns")
            line_no += 1
    return found


def test_the_diff_reader_finds_long_added_lines_with_their_place():
    diff = "\n".join(["+++ b/x.py", "@@ -1,0 +7,2 @@", "+" + "a" * 121, "+ok", "+++ b/bench/results/r.py",
                      "@@ -0,0 +1 @@", "+" + "b" * 200])
    assert _long_added_lines(diff) == ["x.py:7: 121 columns"]


def test_new_and_changed_lines_are_at_most_120_columns():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to compare with")
    known = subprocess.run(["git", "cat-file", "-e", f"{LIMIT_SINCE}^{{commit}}"], cwd=ROOT, capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"{LIMIT_SINCE} is not in this clone's history (a shallow clone)")
    diff = subprocess.run(["git", "diff", "-U0", "--no-color", "--no-ext-diff", LIMIT_SINCE, "--", "*.py"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    long = _long_added_lines(diff)
    assert not long, f"lines added or changed since {LIMIT_SINCE} are over {LIMIT} columns: {long[:20]}"
