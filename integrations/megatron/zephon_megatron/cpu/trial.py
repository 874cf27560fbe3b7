"""Try Zephon on Megatron-LM on a laptop: train, checkpoint, resume on another data-parallel degree.

    python -m zephon_megatron.cpu                                   # dp=4 for 3 iterations, then dp=2 for 3 more
    python -m zephon_megatron.cpu --nproc 2 --resume-nproc 1 --workdir /tmp/mg-try

A tiny GPT (2 layers, hidden 64) over the bundled corpus and tokenizer (Megatron's HuggingFaceTokenizer,
offline), fed by the bundled 8-lane recipe ``configs/data/mg_train.toml`` through the wheel entry
(``zephon_megatron.pretrain_gpt``). The first launch trains ``--iters`` iterations on ``--nproc`` processes
and saves a checkpoint with its loader state; the second loads it on ``--resume-nproc`` processes and
trains ``--more-iters`` more. On CPU each launch is torchrun running ``zephon_megatron.cpu.entry`` (the
shim, then the entry) over gloo with ``CPU_FLAGS``; ``--device cuda`` runs the same launches on GPUs
(NCCL) without the shim, as ``scripts/gpu_check.sh`` does.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from zephon_core.integration import bundled_configs
from zephon_core.integration.trial import run_launch, trial_folder, trial_parser

#: What Megatron needs on a CPU with gloo: no fused kernels, no TransformerEngine, no CUDA-only gradient clipping.
#: Everything after the backend also runs on any GPU (no TransformerEngine or Apex needed there either).
CPU_FLAGS = [
    "--distributed-backend", "gloo",
    "--transformer-impl", "local",
    "--no-gradient-accumulation-fusion",
    "--no-persist-layer-norm",
    "--no-masked-softmax-fusion",
    "--no-bias-gelu-fusion",
    "--no-bias-dropout-fusion",
    "--no-rope-fusion",
    "--num-workers", "0",
    "--clip-grad", "0.0",
]

#: The environment of every rank on a CPU (one thread each: the ranks share the machine's cores).
CPU_ENV = {
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "TORCHDYNAMO_DISABLE": "1",
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}

MICRO_BATCH, GLOBAL_BATCH, SEQ = 2, 16, 64  # 8 micro-batches a step: one per lane of mg_train.toml


def megatron_args(workdir: Path, iters: int, save_interval: int, *, device: str, tp: int = 1) -> list[str]:
    """The wheel entry's flags for one launch: the tiny GPT, the bundled recipe, checkpoints with loader state."""
    configs = bundled_configs()
    args = [
        "--tensor-model-parallel-size", str(tp),
        "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ),
        "--micro-batch-size", str(MICRO_BATCH), "--global-batch-size", str(GLOBAL_BATCH), "--train-iters", str(iters),
        "--lr", "1e-3", "--min-lr", "1e-3", "--lr-decay-style", "constant", "--lr-warmup-iters", "0", "--seed", "1234",
        "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(configs / "corpus"),
        "--use-cpu-initialization", "--ckpt-format", "torch", "--log-interval", "1", "--eval-iters", "0",
        "--override-opt_param-scheduler",  # the resumed launch has more iterations: its own LR schedule
        "--zephon-recipe", str(configs / "data" / "mg_train.toml"),
        "--zephon-aggregate-dir", str(workdir / "aggregate"), "--zephon-run-id", "try",
        "--save", str(workdir / "checkpoints"), "--load", str(workdir / "checkpoints"),
        "--save-interval", str(save_interval), "--dataloader-save", str(workdir / "loader-state"),
    ]
    return args + (CPU_FLAGS if device == "cpu" else CPU_FLAGS[2:])


def launch_command(nproc: int, entry_args: list[str], *, device: str) -> list[str]:
    """torchrun on this machine (a free port): the CPU entry (shim first), or the wheel entry itself on GPUs.

    Only the first and the last rank print: Megatron says most things on rank 0, its training log on the last."""
    entry = ["-m", "zephon_megatron.cpu.entry", "wheel"] if device == "cpu" else ["-m", "zephon_megatron.pretrain_gpt"]
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--max-restarts", "0",
            "--local-ranks-filter", ",".join(dict.fromkeys(("0", str(nproc - 1)))), *entry, *entry_args]


def launch_env(device: str) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if device == "cpu":
        env.update({k: env.get(k, v) for k, v in CPU_ENV.items()})
    else:
        env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    return env


def run(nproc: int, entry_args: list[str], *, device: str) -> int:
    return run_launch(launch_command(nproc, entry_args, device=device), launch_env(device))


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = trial_parser("python -m zephon_megatron.cpu", __doc__.splitlines()[0],
                      workdir="checkpoints, loader states, aggregation")
    ap.add_argument("--iters", type=int, default=3, help="iterations of the first launch; it saves at the last")
    ap.add_argument("--more-iters", type=int, default=3,
                    help="iterations the resumed launch trains after the checkpoint")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size (micro-batches reach its peers by the "
                    "adapter's broadcast); data-parallel degree = processes / tp")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    work = trial_folder(a.workdir, "zephon-mg-try-")
    if rc := run(a.nproc, megatron_args(work, a.iters, a.iters, device=a.device, tp=a.tp), device=a.device):
        return rc
    total = a.iters + a.more_iters
    if rc := run(a.resume_nproc, megatron_args(work, total, total, device=a.device, tp=a.tp), device=a.device):
        return rc
    print(f"zephon: trained iterations 1-{a.iters} on dp={a.nproc // a.tp}, checkpointed, resumed iterations "
          f"{a.iters + 1}-{total} on dp={a.resume_nproc // a.tp}; checkpoints in {work / 'checkpoints'}", flush=True)
    return 0
