"""Zephon-on-TorchTitan launches shared by the demo and the e2e tests."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

from torchtitan_cpu import harness
from zephon_core.integration.batch_log import read_batch_log

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "data" / "tt_train.toml"
ASSETS = ROOT / "configs" / "corpus"
TOML_022 = ROOT / "configs" / "torchtitan" / "llama3_debug_zephon_022.toml"
GLOBAL_BATCH, LOCAL_BATCH, SEQ_LEN = 8, 2, 128


def launch(version: str, nproc: int, dump: Path, *, steps: int = 6, extra: list[str] = (), loader: dict | None = None,
           resume_from: Path | None = None, check: bool = True, timeout: float = 900,
           metrics: bool = False, source_loss: bool = False, mixing: bool = False,
           zephon_trainer: bool = False) -> harness.RunResult:
    """One torchrun launch of llama3's debug model fed by Zephon; batches logged per rank.

    ``zephon_trainer`` (0.3): the recipe module's ``llama3_debugmodel_zephon`` (on ``ZephonTrainer``, which runs no
    training for the steps a recipe's ``[surgery]`` skips) instead of llama3's own recipe.
    ``metrics``: Zephon's figures in TorchTitan's metrics, written to TensorBoard under ``dump/tb``.
    ``source_loss`` (0.3, with ``metrics``): the training loss per source too (``zephon/loss/<source>``).
    ``mixing`` (0.3, with ``source_loss``): the recipe's ``[mixing]`` steers the mixture.
    """
    dump.mkdir(parents=True, exist_ok=True)
    if resume_from is not None:
        shutil.copytree(resume_from, dump / "checkpoint" / resume_from.name, dirs_exist_ok=True)
    opts = {"recipe": str(RECIPE), "aggregate_dir": str(dump / "aggregate"), "run_id": "e2e", "aggregate_timeout_s": 300}
    opts.update(loader or {})
    common = ["--training.steps", str(steps), "--training.global_batch_size", str(GLOBAL_BATCH),
              "--training.local_batch_size", str(LOCAL_BATCH), "--training.seq_len", str(SEQ_LEN),
              "--checkpoint.enable", "--checkpoint.interval", "2", "--lr_scheduler.warmup_steps", "1"]
    if metrics:
        common += ["--metrics.enable_tensorboard"]
    if harness.normalize_version(version) == "0.3":
        loader_kwargs = {"global_batch_size": GLOBAL_BATCH, **opts, **({"source_loss": True} if source_loss else {}),
                         **({"mixing": True} if mixing else {})}
        overrides = ["zephon_torchtitan.zephon_loader=" + json.dumps(loader_kwargs)]
        overrides += ["zephon_torchtitan.zephon_metrics"] if metrics else []
        overrides += ["zephon_torchtitan.zephon_source_loss"] if source_loss else []
        module, config = ("llama3", "llama3_debugmodel")
        if zephon_trainer:
            module, config = "zephon_torchtitan", "llama3_debugmodel_zephon"
        args = ["--module", module, "--config", config, "--hf_assets_path", str(ASSETS), "--dump_folder", str(dump),
                "--override.imports", *overrides,
                "--training.mixed_precision_param", "float32", "--debug.seed", "0", "--metrics.log_freq", "1",
                "--metrics.disable_color_printing", *common]
    else:
        zephon = [f"--zephon.{k}={v}" for k, v in opts.items()] + (["--zephon.log_metrics"] if metrics else [])
        args = ["--job.config_file", str(TOML_022), "--model.hf_assets_path", str(ASSETS), "--job.dump_folder", str(dump),
                *zephon, *common]
    env = {"ZEPHON_BATCH_LOG": str(dump / "batches-rank{rank}.log"),
           "PYTHONPATH": f"{ROOT}:{ROOT / 'integrations' / 'torchtitan'}"}
    return harness.run_torchtitan(version, nproc, [*args, *extra], dump, env=env, cpu_defaults=False, timeout=timeout, check=check)


def best_fit_recipe(folder: Path) -> Path:
    """``RECIPE`` packed ``best_fit`` (whole documents per row, padded; longer ones split), written into ``folder``.

    Fit windows of 4 documents: a window places its longest pieces first, so with the corpus' long documents a
    large window would open a short run with nothing but full-row pieces; with 4 the first batches already hold
    padded rows of whole documents."""
    text = RECIPE.read_text().replace('"../corpus/', f'"{ASSETS}/')
    out = folder / "tt_train_best_fit.toml"
    out.write_text(text.replace("canonical_replicas = 4", 'canonical_replicas = 4\npack_mode = "best_fit"\npack_window = 4'))
    return out


def surgery_recipe(folder: Path, skip_steps: str | None) -> Path:
    """``RECIPE`` with a ``[surgery]`` table skipping ``skip_steps`` (``"A..B"``; None: without the table, the same
    data), written into ``folder``."""
    out = folder / f"tt_train_{'surgery' if skip_steps else 'plain'}.toml"
    text = RECIPE.read_text().replace('"../corpus/', f'"{ASSETS}/')
    out.write_text(f'{text}\n[surgery]\nskip_steps = ["{skip_steps}"]\n' if skip_steps else text)
    return out


def mixed_recipe(folder: Path) -> Path:
    """``RECIPE``'s lanes, seed and shuffle over the three curriculum corpora (examples, reference, prose) mixed
    2:1:1 by documents, written into ``folder``: a run whose loss can be told apart by source (``source_loss``)."""
    sources = "".join(f'\n[[sources]]\nname = "{name}"\npath = "{ASSETS}/curriculum/{name}.jsonl"\nweight = {w}\n'
                      for name, w in (("examples", 2.0), ("reference", 1.0), ("prose", 1.0)))
    # Chunks of 4 documents (2, 1, 1): a lane changes source every few rows, so even a short run sees all three.
    head = RECIPE.read_text().split("[[sources]]")[0].replace("chunk_size = 16", "chunk_size = 4")
    out = folder / "tt_train_mixed.toml"
    out.write_text(head + sources + "\n[shuffle]\nwindow = 4\nseed = 3\n")
    return out


def token_corpora(folder: Path, names: tuple[str, ...] = ("examples", "prose", "reference")) -> None:
    """``<name>.npy`` and ``<name>_offsets.npy`` in ``folder`` for each curriculum corpus: its first 120 texts
    tokenized, cut into documents of 8-16 tokens (token arrays: a run's data needs no tokenizer to reproduce)."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ASSETS / "tokenizer.json"))
    for name in names:
        texts = [json.loads(line)["text"] for line in (ASSETS / "curriculum" / f"{name}.jsonl").open()][:120]
        ids = np.concatenate([e.ids + [1] for e in tok.encode_batch(texts, add_special_tokens=False)]).astype(np.int32)
        lengths = 8 + np.arange(len(ids) // 12) % 9
        lengths = lengths[np.cumsum(lengths) <= len(ids)]
        np.save(folder / f"{name}.npy", ids[: lengths.sum()])
        np.save(folder / f"{name}_offsets.npy", np.concatenate([[0], np.cumsum(lengths)]))


def batch_log(dump: Path) -> dict[int, dict[tuple[int, int], str]]:
    """Per rank: (lane, lane_index) -> digest of every batch that rank delivered."""
    out: dict[int, dict[tuple[int, int], str]] = {}
    for f in sorted(dump.glob("batches-rank*.log")):
        rank = int(f.stem.split("rank")[1])
        out[rank] = {(b.lane, b.lane_index): b.digest for b in read_batch_log(f)}
    return out


def steps_of(dump: Path, canonical_replicas: int, batches_per_step: int = GLOBAL_BATCH // LOCAL_BATCH) -> dict[int, dict[tuple[int, int], str]]:
    """Global step (from 1) -> every batch in it, keyed by (lane, lane_index): topology-free."""
    per_lane = batches_per_step // canonical_replicas
    steps: dict[int, dict[tuple[int, int], str]] = defaultdict(dict)
    for entries in batch_log(dump).values():
        for key, digest in entries.items():
            prev = steps[key[1] // per_lane + 1].setdefault(key, digest)
            assert prev == digest, f"two ranks delivered different batches as lane {key[0]} batch {key[1]}"
    return dict(steps)

