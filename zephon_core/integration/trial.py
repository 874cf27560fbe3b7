"""What both laptop commands share (``python -m zephon_torchtitan.cpu``, ``python -m zephon_megatron.cpu``):
their common options and running one launch in the foreground. Each adapter adds its framework's flags."""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path


def trial_parser(prog: str, description: str, *, workdir: str) -> argparse.ArgumentParser:
    """``--workdir``, ``--nproc``, ``--resume-nproc`` and ``--device``; ``workdir``: what that folder holds."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--workdir", type=Path, help=f"{workdir}; default: a new temporary folder")
    ap.add_argument("--nproc", type=int, default=4, help="processes (data-parallel ranks) of the first launch")
    ap.add_argument("--resume-nproc", type=int, default=2, help="processes of the resumed launch")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: GPUs and NCCL, without the shim")
    return ap


def trial_folder(workdir: Path | None, prefix: str) -> Path:
    """``--workdir``, or a new temporary folder."""
    return (workdir or Path(tempfile.mkdtemp(prefix=prefix))).resolve()


def run_launch(cmd: list[str], env: Mapping[str, str]) -> int:
    """Say the command, run it with this terminal as its output; its exit status."""
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=dict(env)).returncode
