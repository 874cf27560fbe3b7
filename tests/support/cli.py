"""The ``zephon`` command line run as a user runs it: one subprocess per call, this environment's Python."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_PATHS = [ROOT, ROOT / "integrations" / "torchtitan", ROOT / "integrations" / "megatron"]


def zephon(*args: str, cwd: str | Path | None = None, timeout: float = 600,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``zephon ARGS...`` (as ``python -m zephon_core.cli``), in ``cwd``; its output captured as text.

    This clone and its adapters come first on the child's path, so it runs the code under test
    whatever the environment has installed.
    """
    full = dict(os.environ if env is None else env)
    full["PYTHONPATH"] = os.pathsep.join([*map(str, _PATHS), full.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "zephon_core.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full)
