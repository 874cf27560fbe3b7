"""One measurement in a fresh process: ``python bench/cases.py CASE JSON`` (bench/run.py starts these).

The cases are the shared ones (throughput of any loader in bench/loaders, the determinism digests, the
corpus, the package versions) and those each goal in bench/goals owns (``Goal.cases``). Every case prints
one ``RESULT {json}`` line. This runs in either venv: the modules it imports only import stdlib and bench
modules at import time, and each case imports its libraries itself.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import determinism
import machine
import throughput
from goals import REGISTRY


def all_cases() -> dict[str, Callable[[dict], None]]:
    """Every case by name: the shared ones, then each goal's (a name may be defined once only)."""
    out: dict[str, Callable[[dict], None]] = {
        "throughput": throughput.case_throughput,
        "digests": determinism.case_digests,
        "prepare": machine.case_prepare,
        "versions": machine.case_versions,
    }
    for goal in REGISTRY:
        for name, fn in goal.cases.items():
            assert name not in out, f"two cases are named {name}"
            out[name] = fn
    return out


if __name__ == "__main__":
    cases = all_cases()
    if len(sys.argv) < 2 or sys.argv[1] not in cases:
        raise SystemExit(f"usage: bench/cases.py CASE JSON (CASE: {', '.join(sorted(cases))})")
    cases[sys.argv[1]](json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
