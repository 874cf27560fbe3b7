"""Launch real TorchTitan training runs on CPU for e2e tests, and read their losses.

    from harness import run_torchtitan            # (or via the package path)
    r = run_torchtitan("0.3", 2, ["--training.steps", "4", "--checkpoint.enable",
                                  "--checkpoint.interval", "2"], dump_folder=tmp)
    r.losses        # {1: 8.08487, 2: 8.03077, ...}

Each call runs ``torchrun --standalone`` (the rendezvous binds a free port) on
the CPU shim ``zephon_torchtitan/cpu/shim.py`` (by path, as ``python -m zephon_torchtitan.cpu``
does), with a wall-clock timeout, and writes the console log (rank ``log_rank`` only) next to
the checkpoints.  Resume = call again with the same ``dump_folder`` and a larger ``--training.steps``.

Version selection: "0.3"/"0.3.0" use the torchtitan installed in the venv;
"0.2"/"0.2.2" put ``$ZEPHON_TT022`` (the ``--target`` install made by
``scripts/env.sh``; default ``<venv>/torchtitan-0.2.2``) first on PYTHONPATH.

CLI (prints the result as JSON)::

    python harness.py --version 0.3 --nproc 2 --dump-folder /tmp/run -- --training.steps 4
"""


import argparse
import dataclasses
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Found without importing zephon_torchtitan: its __init__ imports torchtitan (0.3 here even for a 0.2 launch).
LAUNCH = Path(importlib.util.find_spec("zephon_torchtitan").origin).parent / "cpu" / "shim.py"
TOML_022 = HERE / "configs" / "llama3_debug_cpu_022.toml"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"(?<!validate )\bstep:\s*(\d+)\s+loss:\s*([-+0-9.eE]+|nan|inf)")
_VALIDATE = re.compile(r"\bvalidate step:\s*(\d+)\s+loss:\s*([-+0-9.eE]+|nan|inf)")
_START = re.compile(r"Training starts at step (\d+)")
_TOML_FLAGS = ("--job.config_file", "--job.config-file")
_LOADED = re.compile(r"Loading the checkpoint from (\S+?)\.?$", re.MULTILINE)


def _load_assets_module():
    try:
        from . import assets  # type: ignore[import-not-found]
    except ImportError:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_zephon_tt_cpu_assets", HERE / "assets.py")
        assets = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(assets)  # type: ignore[union-attr]
    return assets


class TorchTitanRunError(RuntimeError):
    pass


@dataclasses.dataclass
class RunResult:
    version: str
    nproc: int
    returncode: int
    timed_out: bool
    wall_s: float
    losses: dict[int, float]
    """Training loss per step (``step: N  loss: X`` lines), as printed (5 decimals)."""
    validation_losses: dict[int, float]
    start_step: int | None
    """From ``Training starts at step N`` (N > 1 after a resume)."""
    loaded_checkpoint: str | None
    """From ``Loading the checkpoint from <dir>`` (None on a fresh start)."""
    log_path: str
    cmd: list[str]

    def log_text(self) -> str:
        return Path(self.log_path).read_text(errors="replace")


def normalize_version(version: str) -> str:
    v = str(version).strip()
    if v in ("0.3", "0.3.0") or v.startswith("0.3."):
        return "0.3"
    if v in ("0.2", "0.2.2") or v.startswith("0.2."):
        return "0.2"
    raise ValueError(f"unsupported torchtitan version {version!r} (want 0.3.x or 0.2.x)")


def venv_python() -> str:
    return os.environ.get("ZEPHON_PY") or sys.executable


def tt022_path(python: str | None = None) -> str:
    path = os.environ.get("ZEPHON_TT022")
    if not path:
        # scripts/env.sh layout: <venv>/bin/python and <venv>/torchtitan-0.2.2
        path = str(Path(python or venv_python()).parent.parent / "torchtitan-0.2.2")
    if not Path(path, "torchtitan").is_dir():
        raise FileNotFoundError(f"torchtitan 0.2.2 --target folder not found at {path}; source scripts/env.sh")
    return path


def parse_log(text: str) -> dict:
    text = _ANSI.sub("", text)
    losses = {int(s): float(x) for s, x in _STEP.findall(text)}
    val = {int(s): float(x) for s, x in _VALIDATE.findall(text)}
    start = _START.findall(text)
    loaded = _LOADED.findall(text)
    return {
        "losses": losses,
        "validation_losses": val,
        "start_step": int(start[-1]) if start else None,
        "loaded_checkpoint": loaded[-1] if loaded else None,
    }


def default_args(version: str, dump_folder: str, assets: Mapping[str, str]) -> list[str]:
    """CPU-sized llama3 debugmodel run on the stock loader with the offline assets.

    Steps, checkpointing and parallelism are left to the caller.  Later
    arguments win, so callers can override any of these (even --module/--config);
    0.2.x is the exception for ``--job.config_file`` (its ConfigManager takes the
    *first* one), so :func:`run_torchtitan` drops the default TOML when the caller
    passes its own.
    """
    if normalize_version(version) == "0.3":
        return [
            "--module", "llama3",
            "--config", "llama3_debugmodel",
            "--hf_assets_path", assets["hf_assets_path"],
            "--dataloader.dataset_path", assets["dataset_path"],
            "--dump_folder", dump_folder,
            "--training.local_batch_size", "2",
            "--training.seq_len", "256",
            "--training.mixed_precision_param", "float32",
            "--lr_scheduler.warmup_steps", "1",
            "--debug.seed", "0",
            "--metrics.log_freq", "1",
            "--metrics.disable_color_printing",
        ]
    return [
        "--job.config_file", str(TOML_022),
        "--model.hf_assets_path", assets["hf_assets_path"],
        "--training.dataset_path", assets["dataset_path"],
        "--job.dump_folder", dump_folder,
    ]


def _next_log_path(dump_folder: Path) -> Path:
    k = 1
    while (dump_folder / f"launch-{k}.log").exists():
        k += 1
    return dump_folder / f"launch-{k}.log"


def run_torchtitan(
    version: str,
    nproc: int,
    args: Sequence[str] = (),
    dump_folder: str | os.PathLike = "outputs",
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
    assets_dir: str | os.PathLike | None = None,
    cpu_defaults: bool = True,
    log_rank: int = 0,
    log_path: str | os.PathLike | None = None,
    check: bool = True,
    cwd: str | os.PathLike | None = None,
    started: Callable[[subprocess.Popen], None] | None = None,
) -> RunResult:
    """Run TorchTitan ``version`` on ``nproc`` CPU processes; return the parsed losses.

    args:         extra trainer CLI args, appended after the defaults (they win).
    dump_folder:  TorchTitan's dump folder (checkpoints under ``checkpoint/``);
                  the console log goes to ``<dump_folder>/launch-<k>.log``.
    env:          extra environment; ``PYTHONPATH`` entries are appended after the
                  0.2.2 folder.  ``ZEPHON_TT_SHIM_SKIP`` disables shim patches.
    assets_dir:   where the offline tokenizer/dataset live (generated once);
                  default ``<dump_folder>/../tt-assets``.
    cpu_defaults: prepend :func:`default_args` (set False to pass everything).
    log_rank:     the local rank whose console output is kept (PP: the last stage).
    check:        raise :class:`TorchTitanRunError` on a non-zero exit or a timeout.
    cwd:          where the trainer runs (relative paths in job files resolve from it).
    started:      called with the torchrun process once it runs (its own session: ``os.killpg(p.pid, ...)``
                  stops the whole launch, as a fault test does).
    """
    v = normalize_version(version)
    dump = Path(dump_folder).resolve()
    dump.mkdir(parents=True, exist_ok=True)
    assets = _load_assets_module().ensure_assets(assets_dir or dump.parent / "tt-assets")
    python = venv_python()

    user_args = [str(a) for a in args]
    base_args = default_args(v, str(dump), assets) if cpu_defaults else []
    if v == "0.2" and base_args and any(a.split("=", 1)[0] in _TOML_FLAGS for a in user_args):
        i = base_args.index("--job.config_file")
        del base_args[i : i + 2]
    full_args = base_args + user_args
    cmd = [
        python, "-m", "torch.distributed.run",
        "--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc),
        "--local-ranks-filter", str(log_rank), "--role", "rank", "--tee", "3",
        str(LAUNCH), *full_args,
    ]

    run_env = dict(os.environ)
    extra = dict(env or {})
    paths = [tt022_path(python)] if v == "0.2" else []
    for source in (extra.pop("PYTHONPATH", ""), os.environ.get("PYTHONPATH", "")):
        paths += [p for p in source.split(os.pathsep) if p]
    run_env.update(extra)
    run_env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    for key, value in {
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "HF_DATASETS_CACHE": str(dump / "hf_datasets_cache"),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }.items():
        if key not in extra:
            run_env.setdefault(key, value)

    log_file = Path(log_path) if log_path else _next_log_path(dump)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    timed_out = False
    t0 = time.monotonic()
    with open(log_file, "wb") as out:
        out.write(("# " + " ".join(cmd) + "\n").encode())
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=run_env, start_new_session=True, cwd=cwd)
        if started is not None:
            started(proc)
        try:
            rc = proc.wait(timeout=timeout)
        except BaseException as e:  # a timeout, or Ctrl-C / a test's own timeout: never leave the ranks running
            if not isinstance(e, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
                raise
            timed_out = True
            for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
                try:
                    os.killpg(proc.pid, sig)  # the session this call started
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            rc = proc.returncode if proc.returncode is not None else -9
    wall = time.monotonic() - t0

    parsed = parse_log(log_file.read_text(errors="replace"))
    result = RunResult(
        version=v, nproc=nproc, returncode=rc, timed_out=timed_out, wall_s=round(wall, 1),
        log_path=str(log_file), cmd=cmd, **parsed,
    )
    if check and (rc != 0 or timed_out):
        tail = "\n".join(_ANSI.sub("", result.log_text()).splitlines()[-40:])
        why = f"timed out after {timeout}s" if timed_out else f"exit code {rc}"
        raise TorchTitanRunError(f"torchtitan {v} on {nproc} procs: {why}; log {log_file}\n{tail}")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run TorchTitan on CPU and print the losses as JSON.")
    ap.add_argument("--version", required=True, help="0.3 (installed) or 0.2 (ZEPHON_TT022)")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--dump-folder", required=True)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--assets-dir")
    ap.add_argument("--log-rank", type=int, default=0)
    ap.add_argument("--no-cpu-defaults", action="store_true")
    ap.add_argument("trainer_args", nargs=argparse.REMAINDER, help="after --: trainer CLI args")
    a = ap.parse_args(argv)
    targs = a.trainer_args[1:] if a.trainer_args[:1] == ["--"] else a.trainer_args
    r = run_torchtitan(
        a.version, a.nproc, targs, a.dump_folder, timeout=a.timeout, assets_dir=a.assets_dir,
        cpu_defaults=not a.no_cpu_defaults, log_rank=a.log_rank, check=False,
    )
    out = dataclasses.asdict(r)
    out.pop("cmd")
    print(json.dumps(out, indent=1))
    return 0 if r.returncode == 0 and not r.timed_out else 1


if __name__ == "__main__":
    sys.exit(main())
