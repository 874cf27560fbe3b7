"""Try Zephon on TorchTitan on a laptop: train, checkpoint, resume on another data-parallel degree.

    python -m zephon_torchtitan.cpu                                  # dp=4 for 4 steps, then dp=2 for 2 more
    python -m zephon_torchtitan.cpu --nproc 2 --resume-nproc 1 --workdir /tmp/tt-try

The job is the recipe module's ``llama3_debugmodel_zephon`` (llama3's debug model on the bundled corpus,
tokenizer and 4-lane recipe). The first launch trains ``--steps`` steps on ``--nproc`` processes and
checkpoints; the second resumes from that checkpoint, in the same dump folder, on ``--resume-nproc``
processes and trains ``--more-steps`` more. On CPU each launch is torchrun running TorchTitan's trainer
through ``shim.py`` (gloo). ``--device cuda`` runs the same launches on GPUs (NCCL) without the shim, as
``scripts/gpu_check.sh`` does; ``--metrics`` adds Zephon's figures to TorchTitan's console lines
(the share of time the loop waited for data), ``--loader-rate N`` times the loader alone afterwards.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from zephon_core.integration.trial import run_launch, trial_folder, trial_parser

SHIM = Path(__file__).with_name("shim.py")


def trainer_args(dump: Path, steps: int, *, device: str, metrics: bool) -> list[str]:
    """TorchTitan's flags for one launch: the recipe module's job, checkpointed at its last step."""
    args = ["--module", "zephon_torchtitan", "--config", "llama3_debugmodel_zephon", "--dump_folder", str(dump),
            "--training.steps", str(steps), "--checkpoint.enable", "--checkpoint.interval", "2",
            "--dataloader.aggregate-dir", str(dump / "aggregate"), "--dataloader.run-id", "try",
            "--lr_scheduler.warmup_steps", "1", "--debug.seed", "0", "--metrics.log_freq", "1",
            "--metrics.disable_color_printing"]
    if device == "cpu":  # FSDP's mixed precision is for GPUs; gloo reduces in float32
        args += ["--training.mixed_precision_param", "float32"]
    if metrics:
        args += ["--override.imports", "zephon_torchtitan.zephon_metrics"]
    return args


def launch_command(nproc: int, args: list[str], *, device: str) -> list[str]:
    """torchrun on this machine: the CPU shim by path, or TorchTitan's own entry on GPUs."""
    entry = [str(SHIM)] if device == "cpu" else ["-m", "torchtitan.train"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "--local-ranks-filter", "0", *entry, *args]


def launch_env(device: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if device == "cpu":  # one thread per rank: the ranks share the machine's cores
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run(nproc: int, args: list[str], *, device: str) -> int:
    return run_launch(launch_command(nproc, args, device=device), launch_env(device))


def loader_rate(batches: int) -> float:
    """Tokens a second the job's loader delivers alone (one process, every lane, the job's batch shape)."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from zephon_core.integration import bundled_configs, load_recipe
    from zephon_torchtitan.core import TokenizerAdapter

    configs = bundled_configs()
    tok = TokenizerAdapter(HuggingFaceTokenizer(tokenizer_path=str(configs / "corpus")))
    pipeline = load_recipe(configs / "data" / "tt_train.toml").build(
        seq_len=128, batch_size=2, tokenizer=tok, bos_id=tok.bos_id, eos_id=tok.eos_id, dp_degree=1, dp_group_id=0)
    with pipeline:
        start, tokens = time.perf_counter(), 0
        for b, _ in zip(pipeline, range(batches)):
            tokens += b.input_ids.size
        return tokens / (time.perf_counter() - start)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = trial_parser("python -m zephon_torchtitan.cpu", __doc__.splitlines()[0],
                      workdir="the dump folder (checkpoints)")
    ap.add_argument("--steps", type=int, default=4, help="steps of the first launch; it checkpoints at the last")
    ap.add_argument("--more-steps", type=int, default=2, help="steps the resumed launch trains after the checkpoint")
    ap.add_argument("--metrics", action="store_true", help="Zephon's figures in TorchTitan's metrics and console")
    ap.add_argument("--loader-rate", type=int, default=0, metavar="N", help="then time N batches of the loader alone")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    dump = trial_folder(a.workdir, "zephon-tt-try-")
    first = trainer_args(dump, a.steps, device=a.device, metrics=a.metrics)
    if rc := run(a.nproc, first, device=a.device):
        return rc
    resumed = trainer_args(dump, a.steps + a.more_steps, device=a.device, metrics=a.metrics)
    if rc := run(a.resume_nproc, resumed, device=a.device):
        return rc
    print(f"zephon: trained steps 1-{a.steps} on dp={a.nproc}, checkpointed, resumed steps {a.steps + 1}-"
          f"{a.steps + a.more_steps} on dp={a.resume_nproc}; checkpoints in {dump / 'checkpoint'}", flush=True)
    if a.loader_rate:
        print(f"zephon: the loader alone: {loader_rate(a.loader_rate):.0f} tokens/s "
              f"({a.loader_rate} batches of 2 x 128 tokens, one process)", flush=True)
    return 0
