"""Run a snippet under TorchTitan 0.2.2 (the ``--target`` install beside the venv): it shadows 0.3 on PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run_022(code: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -c code`` with TorchTitan 0.2.2 and this checkout first on the path; the snippet ends by printing ok."""
    tt022 = Path(sys.executable).resolve().parent.parent / "torchtitan-0.2.2"
    if not tt022.is_dir():
        tt022 = Path(os.environ.get("ZEPHON_TT022", ""))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tt022), str(ROOT), str(ROOT / "integrations" / "torchtitan")])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
    return r
