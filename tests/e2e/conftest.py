"""End-to-end tests: real training loops under torchrun on CPU (slow; ~25 s per launch).

The two frameworks' CPU harnesses both live in modules named ``harness``;
load them by path (``harnesses.load``) rather than through sys.path.

Every test here is marked ``e2e`` (``bash scripts/test.sh --fast`` deselects them), so a new
launch needs no mark of its own to stay out of the inner loop.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A conftest's hook sees the whole session's items: only this folder's are marked.
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)
