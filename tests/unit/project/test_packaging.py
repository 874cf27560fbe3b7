"""The distribution installs as users get it: packages, the ``zephon`` console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_wheel_installs_packages_and_console_script(tmp_path):
    target = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(ROOT)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    for package in ("zephon_core", "zephon_torchtitan", "zephon_megatron"):
        assert (target / package / "__init__.py").is_file(), f"{package} missing from the wheel"
    assert not (target / "tests").exists()
    script = target / "bin" / "zephon"
    assert script.is_file()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    r = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0 and "verify-elastic" in r.stdout, r.stderr
