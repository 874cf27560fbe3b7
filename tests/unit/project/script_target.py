"""Tests for tests/unit/project/test_test_script.py to run through scripts/test.sh (not collected on their own:
the file name does not start with test_)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest


def test_quick():
    assert 1 + 1 == 2


def test_sleeps_with_children():
    """Start what the e2e tests start (a child in its own session, one under coreutils timeout), then wait to be stopped."""
    pidfile = os.environ.get("ZEPHON_SIGNAL_TARGET")
    if not pidfile:
        pytest.skip("only run by test_test_script.py")
    own_session = subprocess.Popen(["sleep", "300"], start_new_session=True)
    under_timeout = subprocess.Popen(["timeout", "300", "sleep", "300"])
    with open(pidfile + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {own_session.pid} {under_timeout.pid}\n")
    os.replace(pidfile + ".tmp", pidfile)
    time.sleep(300)
