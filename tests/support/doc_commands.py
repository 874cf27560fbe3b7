"""Every shell command the README, docs/, configs/ and the examples show, as written.

``documented()`` extracts them: ```bash / ```console blocks (continuation lines
joined, comments dropped), inline code spans that start with a command, and the
usage lines of config files and example docstrings. ``tests/unit/project/
test_documented_commands.py`` requires each one to be run by it, run by a named
test (the e2e launches, on CPU through the documented launcher), or exempted
with a reason; the e2e tests take their commands from here, so a changed doc
changes what they run.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "zephon_core" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
STARTS = ("zephon ", "python ", "bash ", "torchrun ", "pip install ", "$ZEPHON_PY ", "source scripts/")
# A usage line in a config file or an example's docstring: optional VAR=value words, then a command.
USAGE = re.compile(r"^\s*(?:#\s*|Run with:\s*)?((?:[A-Z_]+=\S+\s+)*(?:torchrun|python|bash|zephon)\s.*)$")


@dataclass(frozen=True)
class Command:
    where: str  # "docs/cli.md#3" (a block), "docs/cli.md:9" (a line), "configs/...:4"
    text: str
    output: str | None = None  # what a ```console block shows it printing

    def argv(self) -> list[str]:
        return shlex.split(self.text)


def _join_continuations(lines: list[str]) -> list[str]:
    out: list[str] = []
    pending = ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].strip() + " "
            continue
        out.append((pending + line.strip()).strip())
        pending = ""
    return out


def _strip_comment(line: str) -> str:
    # "  # " starts a trailing comment in these docs; a quoted '#' never appears in them.
    return re.split(r"\s+#\s", line, maxsplit=1)[0].strip()


def _from_markdown(doc: Path) -> list[Command]:
    rel = doc.relative_to(ROOT).as_posix()
    text = doc.read_text()
    out = []
    for n, m in enumerate(FENCE.finditer(text)):
        kind, body = m.group(1), m.group(2)
        if kind == "bash":
            for line in _join_continuations(body.splitlines()):
                line = _strip_comment(line)
                if line and not line.startswith("#"):
                    out.append(Command(f"{rel}#{n}", line))
        elif kind == "console":
            for cmd, shown in re.findall(r"^\$ (.*)\n((?:(?!\$ ).*\n)*)", body, re.MULTILINE):
                out.append(Command(f"{rel}#{n}", cmd.strip(), shown.strip()))
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for lineno, line in enumerate(prose.splitlines(), 1):
        for span in re.findall(r"`([^`\n]+)`", line):
            if span.startswith(STARTS):
                out.append(Command(f"{rel}:{lineno}", span.strip()))
    return out


def _from_usage_lines(path: Path) -> list[Command]:
    rel = path.relative_to(ROOT).as_posix()
    lines = path.read_text().splitlines()
    out = []
    for lineno, line in enumerate(lines, 1):
        m = USAGE.match(line)
        if not m:
            continue
        text, extra = m.group(1).rstrip(), lineno
        while text.endswith("\\") and extra < len(lines):  # a usage spread over lines
            text = text[:-1].rstrip() + " " + lines[extra].lstrip("# ").strip()
            extra += 1
        out.append(Command(f"{rel}:{lineno}", text.strip()))
    return out


def documented() -> list[Command]:
    """Every command shown to users, in file order."""
    out: list[Command] = []
    for doc in DOCS:
        out += _from_markdown(doc)
    files = sorted(p for p in (ROOT / "configs").rglob("*") if p.is_file() and p.suffix in (".sh", ".py", ".toml"))
    files += sorted((ROOT / "docs" / "examples").glob("*.py"))
    for f in files:
        out += _from_usage_lines(f)
    return out


def find(pattern: str) -> Command:
    """The one documented command matching ``pattern`` (a regular expression searched in its text)."""
    hits = [c for c in documented() if re.search(pattern, c.text)]
    assert len(hits) >= 1, f"no documented command matches {pattern!r}"
    return hits[0]


def after(argv: list[str], marker: str) -> list[str]:
    """The arguments after ``marker`` (e.g. what follows ``-m torchtitan.train``)."""
    for i in range(len(argv) - 1):
        if " ".join(argv[i : i + 2]) == marker:
            return argv[i + 2 :]
    raise AssertionError(f"{marker!r} not in {argv}")
