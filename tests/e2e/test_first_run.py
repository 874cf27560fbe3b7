"""The commands a new user copies from the README, docs/ and configs/, run as written on CPU.

Each launch takes its command from the docs (``doc_commands``), so a doc that changes
changes what runs here. Where the docs assume GPUs, the command goes through the
documented CPU launchers (``zephon_torchtitan/cpu/shim.py``, Megatron's
``zephon_megatron.cpu.entry``) with only what they document as different on a CPU;
each framework's laptop command (``python -m zephon_torchtitan.cpu``,
``python -m zephon_megatron.cpu``) runs as written. Each run also checks that
``zephon trace`` on the training recipe prints exactly the batches the run logged
(``ZEPHON_BATCH_LOG``), and ``zephon inspect`` reads its checkpoints. Nine launches, about 6-8 minutes on 2 cores.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from harnesses import load
from support.cli import zephon
from support.doc_commands import ROOT, after, find

from zephon_core.integration.batch_log import read_batch_log

pytestmark = pytest.mark.e2e
tt = load("torchtitan")
mg = load("megatron")
CONFIGS = ROOT / "configs"


def logged_steps(folder: Path, batches_per_step: int, C: int) -> dict[int, dict[tuple[int, int], str]]:
    """Global step -> {(lane, lane_index): digest} from every rank's batch log."""
    per_lane = batches_per_step // C
    steps: dict[int, dict[tuple[int, int], str]] = {}
    for f in folder.glob("batches-rank*.log"):
        for b in read_batch_log(f):
            steps.setdefault(b.lane_index // per_lane + 1, {})[(b.lane, b.lane_index)] = b.digest
    return steps


def traced(out: str) -> dict[tuple[int, int], str]:
    return {(int(m[1]), int(m[2])): m[3] for m in re.finditer(r"lane (\d+) batch (\d+)  digest ([0-9a-f]+)", out)}


def user_folder(tmp_path: Path) -> Path:
    """A folder laid out like the repository root for relative paths: configs/ is the bundled one."""
    (tmp_path / "configs").symlink_to(CONFIGS)
    return tmp_path


def test_readme_demo_runs_as_written():
    cmd = find(r"^bash scripts/demo\.sh$")
    r = subprocess.run(cmd.argv(), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "every global step's samples matched the uninterrupted plan" in r.stdout


def run_laptop_command(module: str, workdir: Path, *, framework: str, lanes: int, step: int) -> str:
    """The docs' `python -m MODULE` (this environment's python, a kept --workdir): dp=4, a checkpoint at ``step``,
    resumed on dp=2; rank 0 says which recipe and lanes fed each launch and, once, where the state stood."""
    argv = find(rf"^python -m {re.escape(module)}$").argv()
    r = subprocess.run([sys.executable, *argv[1:], "--workdir", str(workdir)], capture_output=True, text=True,
                       timeout=1200)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert out.count(f"zephon: {framework} fed by recipe ") == 2
    for dp in (4, 2):
        per_rank = f"{lanes // dp} lane(s) per data-parallel rank"
        assert f"canonical_replicas={lanes}, data-parallel degree {dp}, {per_rank}" in out
    per_step = {"TorchTitan": 4, "Megatron": 8}[framework]  # batches of a step: global / local batch size
    said = (f"zephon: loader state restored at step {step} ({step * per_step} batches delivered over {lanes} lanes) "
            "from dp=4 to dp=2")
    assert out.count(said) == 1, out[-4000:]
    return out


def test_torchtitan_on_a_laptop_trains_checkpoints_and_resumes_on_another_dp(tmp_path):
    out = run_laptop_command("zephon_torchtitan.cpu", tmp_path / "work", framework="TorchTitan", lanes=4, step=4)
    losses = tt.parse_log(out)["losses"]
    assert sorted(losses) == [1, 2, 3, 4, 5, 6] and losses[6] < losses[1], losses
    assert (tmp_path / "work" / "checkpoint" / "step-6").is_dir()


def test_megatron_on_a_laptop_trains_checkpoints_and_resumes_on_another_dp(tmp_path):
    out = run_laptop_command("zephon_megatron.cpu", tmp_path / "work", framework="Megatron", lanes=8, step=3)
    assert sorted(mg.parse_losses(out)) == [1, 2, 3, 4, 5, 6]
    assert (tmp_path / "work" / "loader-state" / "iter_0000006").is_dir()


def test_torchtitan_022_job_file_runs_as_written(tmp_path):
    """The job file's own command, from a folder where configs/ is what `zephon init` writes."""
    cmd = find(r"--job\.config_file configs/torchtitan/llama3_debug_zephon_022\.toml")
    argv = cmd.argv()
    nproc = int(argv[argv.index("--nproc-per-node") + 1])
    here = user_folder(tmp_path)
    dump = here / "outputs" / "llama3-debug-zephon"  # the job file's [job] dump_folder
    env = {"ZEPHON_BATCH_LOG": str(here / "batches-rank{rank}.log"), "PYTHONPATH": f"{ROOT}:{ROOT / 'integrations' / 'torchtitan'}"}
    r = tt.run_torchtitan("0.2", nproc, after(argv, "-m torchtitan.train"), dump, env=env, cpu_defaults=False, cwd=here, timeout=600)
    assert sorted(r.losses) == [1, 2, 3, 4, 5, 6]
    # zephon trace on the training recipe, with the job's tokenizer and sizes, prints what step 3 trained on.
    out = zephon("trace", "configs/data/tt_train.toml", "--step", "3", "--framework", "torchtitan", "--tokenizer", "configs/corpus",
                 "--seq-len", "128", "--batch-size", "2", "--batches-per-step", "4", cwd=here)
    assert out.returncode == 0, out.stderr
    assert traced(out.stdout) == logged_steps(here, 4, 4)[3]
    # zephon inspect: the step folder, and a one-line pointer to it from the dump folder.
    ok = zephon("inspect", str(dump / "checkpoint" / "step-6"), cwd=here)
    assert ok.returncode == 0 and "canonical_replicas: 4" in ok.stdout, ok.stderr
    bad = zephon("inspect", str(dump), cwd=here)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1
    assert "step-2, step-4, step-6" in bad.stderr and "Traceback" not in bad.stderr


def test_torchtitan_recipe_module_command_runs_as_written(tmp_path):
    """docs/torchtitan.md's `--module zephon_torchtitan` command: the recipe's own tokenizer, sizes and recipes."""
    cmd = find(r"--module zephon_torchtitan --config llama3_debugmodel_zephon")
    args = [a.replace("/shared/agg", str(tmp_path / "agg")) for a in after(cmd.argv(), "-m torchtitan.train")]
    env = {"ZEPHON_BATCH_LOG": str(tmp_path / "batches-rank{rank}.log"), "PYTHONPATH": f"{ROOT}:{ROOT / 'integrations' / 'torchtitan'}"}
    r = tt.run_torchtitan("0.3", 2, args, tmp_path / "outputs", env=env, cpu_defaults=False, cwd=tmp_path, timeout=600)
    assert sorted(r.losses) == list(range(1, 11))
    steps = logged_steps(tmp_path, 4, 4)
    assert sorted(steps) == list(range(1, 11)) and all(len(s) == 4 for s in steps.values())


def _megatron_flags(run_dir: Path, **env: str) -> list[str]:
    """MODEL_FLAGS and ZEPHON_FLAGS of configs/megatron/common.sh, with its documented overrides."""
    script = f'source "{CONFIGS / "megatron" / "common.sh"}"; printf "%s\\n" "${{MODEL_FLAGS[@]}}" "${{ZEPHON_FLAGS[@]}}"'
    full_env = {**os.environ, "RUN_DIR": str(run_dir), **env}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, env=full_env).stdout.splitlines()


def test_megatron_wheel_script_trains_with_the_huggingface_tokenizer(tmp_path):
    """pretrain_gpt_wheel.sh's flags (HuggingFaceTokenizer over configs/corpus, offline) on 2 CPU ranks, sized down
    with the variables common.sh documents; the CPU shim's flags come last."""
    wheel = (CONFIGS / "megatron" / "pretrain_gpt_wheel.sh").read_text()
    assert 'exec "${TORCHRUN[@]}" -m zephon_megatron.pretrain_gpt "${MODEL_FLAGS[@]}" "${ZEPHON_FLAGS[@]}" "$@"' in wheel
    sizes = {"NPROC": "2", "MBS": "2", "GBS": "16", "SEQ": "64", "ITERS": "2", "LAYERS": "2", "HIDDEN": "64", "HEADS": "4", "PRECISION": ""}
    flags = _megatron_flags(tmp_path / "run", **sizes)
    assert flags[flags.index("--tokenizer-type") + 1] == "HuggingFaceTokenizer"
    # The script's "[more flags]": the CPU shim's, a warm-up shorter than the 2 iterations, a log line for each.
    cpu = [*mg.CPU_FLAGS, "--use-cpu-initialization", "--ckpt-format", "torch", "--lr-warmup-iters", "0", "--log-interval", "1"]
    r = mg.launch(["wheel", *flags, *cpu], nproc=2, run_dir=tmp_path / "run", env={"HF_HUB_OFFLINE": "1"}, timeout=400)
    assert r.ok, r.log_tail()
    assert sorted(mg.parse_losses(r.text)) == [1, 2]
    assert "validation loss at iteration 2" in r.text  # the held-out recipe through the same tokenizer
    # Step 2 as zephon trace computes it from the recipe, Megatron's way (EOD only), with the run's sizes.
    out = zephon("trace", str(CONFIGS / "data" / "mg_train.toml"), "--step", "2", "--framework", "megatron", "--tokenizer",
                 str(CONFIGS / "corpus"), "--seq-len", "64", "--batch-size", "2", "--batches-per-step", "8", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert traced(out.stdout) == logged_steps(r.run_dir, 8, 8)[2]
    saved = sorted((tmp_path / "run" / "loader-state").rglob("*.pt"))
    assert saved, "the run saved no loader state"
    shown = zephon("inspect", str(saved[0]), cwd=tmp_path)
    assert shown.returncode == 0 and "canonical_replicas: 8" in shown.stdout, shown.stderr
