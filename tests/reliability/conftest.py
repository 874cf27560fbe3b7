"""Fixtures of the reliability suite and its summary report.

Every test records the cases it tried through the ``rel`` fixture
(``rel.case(name, outcome, samples=..., lost=..., duplicated=...)``). At the
end of the session the records and each test's outcome are written to
``.artifacts/reliability/summary.json`` (or ``$ZEPHON_RELIABILITY_SUMMARY``);
docs/reliability.md quotes those numbers.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import relkit  # pytest puts this folder on the path for its conftest and tests

_HERE = Path(__file__).resolve().parent

_RECORDS: dict[str, dict] = {}
_STARTED = time.time()


class _Recorder:
    def __init__(self, nodeid: str) -> None:
        self.entry = _RECORDS.setdefault(nodeid, {"outcome": None, "duration_s": None, "cases": []})

    def case(self, name: str, outcome: str, *, samples: int = 0, lost: int = 0, duplicated: int = 0) -> None:
        self.entry["cases"].append({"case": name, "outcome": outcome, "samples": samples, "lost": lost, "duplicated": duplicated})


@pytest.fixture
def rel(request) -> _Recorder:
    return _Recorder(request.node.nodeid)


@pytest.fixture(scope="session", autouse=True)
def rank_zygote():
    """Rank processes are forked from one pre-imported parent (see zygote.py)."""
    z = relkit.Zygote()
    relkit.ZYGOTE = z
    yield z
    relkit.ZYGOTE = None
    z.close()


@pytest.fixture(autouse=True)
def private_index_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own JSONL index cache (never ~/.cache)."""
    d = tmp_path_factory.mktemp("index-cache")
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(d))
    return d


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not str(item.path).startswith(str(_HERE)):
        return
    entry = _RECORDS.setdefault(item.nodeid, {"outcome": None, "duration_s": None, "cases": []})
    if rep.when == "call" or (rep.when == "setup" and rep.outcome != "passed"):
        entry["outcome"] = "xfailed" if hasattr(rep, "wasxfail") else rep.outcome
        entry["duration_s"] = round(rep.duration, 2)


def _summary() -> dict:
    tests = {k: v for k, v in sorted(_RECORDS.items()) if v["outcome"] is not None}
    cases = [c for t in tests.values() for c in t["cases"]]
    return {
        "command": "PYTHONPATH=.:integrations/torchtitan:integrations/megatron python -m pytest tests/reliability -q -p no:cacheprovider",
        "soak": os.environ.get("ZEPHON_SOAK") == "1",
        "wall_s": round(time.time() - _STARTED, 1),
        "totals": {
            "tests": len(tests),
            "passed": sum(t["outcome"] == "passed" for t in tests.values()),
            "failed": sum(t["outcome"] == "failed" for t in tests.values()),
            "skipped": sum(t["outcome"] == "skipped" for t in tests.values()),
            "cases": len(cases),
            "samples_checked": sum(c["samples"] for c in cases),
            "lost": sum(c["lost"] for c in cases),
            "duplicated": sum(c["duplicated"] for c in cases),
        },
        "tests": tests,
    }


def pytest_sessionfinish(session, exitstatus):
    if not _RECORDS:
        return
    path = Path(os.environ.get("ZEPHON_RELIABILITY_SUMMARY") or relkit.REPO / ".artifacts" / "reliability" / "summary.json")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_summary(), indent=1, sort_keys=True) + "\n")
    except OSError:
        pass


def pytest_terminal_summary(terminalreporter):
    if _RECORDS:
        t = _summary()["totals"]
        terminalreporter.write_line(
            f"reliability: {t['cases']} cases in {t['tests']} tests, {t['samples_checked']} samples checked, "
            f"{t['lost']} lost, {t['duplicated']} duplicated"
        )
