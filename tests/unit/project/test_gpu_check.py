"""scripts/gpu_check.sh: without CUDA it skips with one line and status 0; with CUDA its launches are the laptop
commands' own (``python -m zephon_torchtitan.cpu`` / ``zephon_megatron.cpu``) with ``--device cuda``, so the
code it runs on a GPU is the code the CPU end-to-end tests run, less the shim."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_without_cuda_it_skips_with_one_line_saying_why():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "ZEPHON_PY": sys.executable}
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["gpu_check: skipped, no CUDA device here (torch.cuda.is_available() is False)"]


def _invocations(module: str) -> list[str]:
    """The flags gpu_check.sh passes to ``-m module`` (continuation lines joined, shell variables given values)."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    found = re.findall(rf'"\$py" -m {re.escape(module)} (.*?)(?: >| \|\||$)', text, re.MULTILINE)
    return [re.sub(r'"\$(tp|out)"|"\$out/\w+"', "1", f).split() for f in found]


def test_its_torchtitan_launches_are_the_laptop_commands_on_cuda():
    pytest.importorskip("torchtitan")
    from zephon_torchtitan.cpu import trial

    (flags,) = _invocations("zephon_torchtitan.cpu")
    a = trial.parse(flags)
    assert a.device == "cuda" and a.metrics and a.loader_rate > 0
    cmd = trial.launch_command(1, trial.trainer_args(Path("dump"), 2, device=a.device, metrics=True), device="cuda")
    assert "-m" in cmd and "torchtitan.train" in cmd and str(trial.SHIM) not in cmd
    assert "zephon_torchtitan.zephon_metrics" in cmd


def test_its_megatron_launches_are_the_laptop_commands_on_cuda():
    from zephon_megatron.cpu import trial

    (flags,) = _invocations("zephon_megatron.cpu")
    a = trial.parse(flags)
    assert a.device == "cuda"
    args = trial.megatron_args(Path("work"), 3, 3, device="cuda", tp=2)
    cmd = trial.launch_command(2, args, device="cuda")
    assert "zephon_megatron.pretrain_gpt" in cmd and "zephon_megatron.cpu.entry" not in cmd
    assert "gloo" not in args and "--transformer-impl" in args  # NCCL; no TransformerEngine needed
    assert args[args.index("--tensor-model-parallel-size") + 1] == "2"


def test_the_loader_rate_it_reports_is_the_loader_alone():
    pytest.importorskip("torchtitan")
    from zephon_torchtitan.cpu import trial

    assert trial.loader_rate(8) > 0
