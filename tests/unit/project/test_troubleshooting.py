"""docs/troubleshooting.md stays true: every message it lists is still raised by the code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _sources() -> str:
    files = list((ROOT / "zephon_core").rglob("*.py")) + list((ROOT / "integrations").rglob("*.py"))
    return "\n".join(f.read_text() for f in files)


def test_every_listed_message_exists_in_the_code():
    doc = (ROOT / "docs" / "troubleshooting.md").read_text()
    code = _sources()
    rows = [line for line in doc.splitlines() if line.startswith("| `") or line.startswith("| *")]
    assert len(rows) >= 30
    missing = []
    for row in rows:
        first_cell = row.split(" | ")[0]
        for fragment in re.findall(r"`([^`]+)`", first_cell):
            probe = fragment.strip().rstrip("'").strip()
            if len(probe) >= 6 and probe not in code and probe.replace("(...)", "(") not in code:
                missing.append(probe)
    assert not missing, f"troubleshooting.md lists messages the code no longer raises: {missing}"
