"""scripts/env.sh: one shared venv per machine, and one venv per clone that runs that clone's code.

A second clone of this repository (with this working tree's env.sh) sets itself up, from another
directory and twice at once, and afterwards each clone's environment still imports its own code,
runs its own ``zephon`` and ``torchrun`` and finds its own state readers: clones never re-point
each other. The second clone reuses the shared venv, so this costs a clone and a few seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# What decides which clone runs: the imported packages, the distribution that registers the state
# readers and the package each names (found, not imported: zephon_torchtitan's imports torch), and
# the commands on PATH (with the python torchrun's file runs).
PROBE = """
import importlib.metadata as m, importlib.util as u, zephon_core, zephon_megatron
for ep in m.entry_points(group="zephon.state_readers"):
    print(ep.dist.locate_file(""), u.find_spec(ep.module.split(".")[0]).origin)
print(zephon_core.__file__, zephon_megatron.__file__)
"""


def _env() -> dict[str, str]:
    # As a fresh shell has it: no PYTHONPATH (test.sh sets one to this clone) and no active venv.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != os.path.join(sys.prefix, "bin"))
    return env


def _bash(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)


def _assert_runs_its_own(clone: Path, cwd: Path) -> None:
    """`source <clone>/scripts/env.sh` (from ``cwd``) runs that clone's python, commands, packages and readers."""
    r = _bash(f"source {clone}/scripts/env.sh && command -v python zephon torchrun"
              f" && sed -n 2p \"$(command -v torchrun)\" && python -c '{PROBE}'", cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    python, zephon, torchrun, torchrun_runs, *files = r.stdout.splitlines()
    assert python == str(clone / ".zephon-env" / "venv" / "bin" / "python"), r.stdout
    assert f'"{python}"' in torchrun_runs, f"{torchrun} runs another python: {torchrun_runs}"
    for p in (zephon, torchrun, *" ".join(files).split()):
        assert Path(p).is_relative_to(clone), f"{p} is not in {clone}"


def test_two_clones_never_re_point_each_other(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=300)
    shutil.copy(ROOT / "scripts" / "env.sh", clone / "scripts" / "env.sh")
    venv = clone / ".zephon-env" / "venv"

    # A build that fails is not marked complete, and the next run makes it again.
    setup = (clone / "setup.py").read_text()
    (clone / "setup.py").write_text("raise SystemExit('broken on purpose')\n")
    r = _bash(f"bash {clone}/scripts/env.sh", tmp_path)
    assert r.returncode != 0 and "installing the project" in r.stderr and not (venv / ".complete").exists(), r.stderr
    (clone / "setup.py").write_text(setup)

    # Two at once, from outside the clone: one builds, the other waits for it.
    runs = [subprocess.Popen(["bash", str(clone / "scripts" / "env.sh")], cwd=tmp_path, env=_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in runs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0 and out.strip() == str(venv), out + err

    _assert_runs_its_own(clone, tmp_path)
    _assert_runs_its_own(ROOT, tmp_path)
    # This process's own interpreter (what scripts/test.sh runs) too, without PYTHONPATH.
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and all(Path(p).is_relative_to(ROOT) for p in r.stdout.split()), r.stdout + r.stderr

    # The shared venv was only read: nothing in it names the second clone.
    shared = Path(_bash(f"source {clone}/scripts/env.sh && echo $ZEPHON_SHARED_VENV", tmp_path).stdout.strip())
    assert (shared / ".complete").is_file()
    site = next(shared.glob("lib/python3*/site-packages"))
    for f in [*site.glob("*.pth"), *site.glob("__editable__*")]:
        assert str(clone) not in f.read_text(errors="replace"), f"{f} names {clone}"
