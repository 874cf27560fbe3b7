"""Megatron-LM's real ``pretrain()`` fed by Zephon, under torchrun on CPU (test only).

``launch()`` runs ``zephon_megatron.cpu.entry`` (the CPU shim, then one of the adapter's entry
points, as ``python -m zephon_megatron.cpu`` does) under ``torchrun`` with a rendezvous on a free port, inside coreutils
``timeout``. ``run()`` adds the CPU flags, a tiny GPT, the Zephon flags and a
per-rank ``ZEPHON_BATCH_LOG``; ``make_assets()`` writes the test corpora
(Megatron ``.bin``/``.idx`` written with megatron-core's own builder, and a
text corpus for Megatron's ``NullTokenizer``, whose text is space-separated
token ids) and their recipes.

Two entry routes, as users run them:

* ``"launch"``: ``python -m zephon_megatron.launch pretrain_tiny_gpt.py`` — a
  stand-in for a checkout's ``pretrain_gpt.py`` with its own provider (which
  the adapter replaces) and Megatron's ``get_batch_on_this_tp_rank``;
* ``"wheel"``: ``python -m zephon_megatron.pretrain_gpt`` — the adapter's own
  ``forward_step`` and tensor-parallel broadcast.

Python: ``$ZEPHON_PY`` (``source scripts/env.sh``), else this interpreter.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from zephon_core.integration.batch_log import read_batch_log
from zephon_megatron.cpu.trial import CPU_ENV, CPU_FLAGS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
STAND_IN = HERE / "pretrain_tiny_gpt.py"
CORPUS = ROOT / "configs" / "corpus"

VOCAB = 2048  # the bundled BPE's vocabulary; NullTokenizer's EOD is VOCAB - 1
SEQ, MBS, GBS = 32, 2, 8
C = 4  # lanes in the test recipes: GBS / MBS = 4 micro-batches per step, one per lane

_LOSS_RE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?\| lm loss: ([-+0-9.eEnaif]+) \|")
_VALID_RE = re.compile(r"validation loss at (.*?) \| lm loss value: ([-+0-9.eEnaif]+) \|")
_VALID_SET_RE = re.compile(r"validation-(\S+) loss at (.*?) \| lm loss value: ([-+0-9.eEnaif]+) \|")
_GBS_RE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?\| global batch size:\s+(\d+) \|")


def python_exe() -> str:
    return os.environ.get("ZEPHON_PY") or sys.executable


def pythonpath() -> str:
    return os.pathsep.join(str(p) for p in (ROOT, ROOT / "integrations" / "torchtitan", ROOT / "integrations" / "megatron"))


# -- results -----------------------------------------------------------------------------
@dataclass
class RunResult:
    returncode: int
    wall_s: float
    run_dir: Path
    log_path: Path
    timed_out: bool = False
    text: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.text.splitlines()[-n:])

    @property
    def logged_losses(self) -> dict[int, float]:
        return parse_losses(self.text)

    @property
    def validation(self) -> dict[str, float]:
        """'iteration 3' -> lm loss of that evaluation."""
        return {m.group(1).strip(): float(m.group(2)) for m in _VALID_RE.finditer(self.text)}

    @property
    def validation_sets(self) -> dict[tuple[str, str], float]:
        """('set name', 'iteration 3') -> lm loss of that set at that evaluation (--multiple-validation-sets)."""
        return {(m.group(1), m.group(2).strip()): float(m.group(3)) for m in _VALID_SET_RE.finditer(self.text)}

    @property
    def global_batches(self) -> dict[int, int]:
        """iteration -> the global batch size Megatron logged for it."""
        return {int(m.group(1)): int(m.group(2)) for m in _GBS_RE.finditer(self.text)}

    def batch_log(self) -> dict[int, list[tuple[int, int, str]]]:
        """Per global rank, in order: (lane, lane_index, digest) of every micro-batch it trained on."""
        out: dict[int, list[tuple[int, int, str]]] = {}
        for f in sorted(self.run_dir.glob("batches-rank*.log")):
            rank = int(f.stem.split("rank")[1])
            out[rank] = [(b.lane, b.lane_index, b.digest) for b in read_batch_log(f)]
        return out

    def steps(self, batches_per_step: int = GBS // MBS, canonical_replicas: int = C,
              schedule: list[int] | None = None) -> dict[int, dict[tuple[int, int], str]]:
        """Global step (from 1) -> {(lane, lane_index): digest}: comparable across topologies.

        ``schedule``: micro-batches of every step from step 1, for a run whose batch size changes.
        """
        step_of = lane_index_to_step(schedule or [batches_per_step], canonical_replicas)
        steps: dict[int, dict[tuple[int, int], str]] = defaultdict(dict)
        for rows in self.batch_log().values():
            for lane, idx, digest in rows:
                prev = steps[step_of(idx)].setdefault((lane, idx), digest)
                assert prev == digest, f"{self.run_dir}: two ranks trained on different batches as lane {lane} batch {idx}"
        return dict(steps)


def lane_index_to_step(batches_per_step: list[int], canonical_replicas: int = C):
    """lane_index -> global step (from 1): step k holds batches_per_step[k-1] / C batches of every lane (the last size repeats)."""
    import bisect

    ends: list[int] = []
    for n in batches_per_step:
        ends.append((ends[-1] if ends else 0) + n // canonical_replicas)
    last = batches_per_step[-1] // canonical_replicas

    def step_of(idx: int) -> int:
        if idx < ends[-1]:
            return bisect.bisect_right(ends, idx) + 1
        return len(ends) + (idx - ends[-1]) // last + 1

    return step_of


def reference_steps(recipe: Path, batches_per_step: list[int], canonical_replicas: int = C) -> dict[int, dict[tuple[int, int], str]]:
    """What every step must hold, computed here from a pretokenized recipe alone (one process, one pipeline)."""
    from zephon_core.recipe import load_recipe

    step_of = lane_index_to_step(batches_per_step, canonical_replicas)
    pipeline = load_recipe(recipe).build(seq_len=SEQ, batch_size=MBS, dp_degree=1, dp_group_id=0,
                                         canonical_replicas=canonical_replicas)
    want = sum(batches_per_step)
    steps: dict[int, dict[tuple[int, int], str]] = defaultdict(dict)
    try:
        for _, b in zip(range(want), pipeline):
            steps[step_of(b.lane_index)][(b.lane, b.lane_index)] = b.digest
    finally:
        pipeline.close()
    return dict(steps)


def parse_losses(text: str) -> dict[int, float]:
    """iteration -> 'lm loss' as Megatron's training_log printed it."""
    return {int(m.group(1)): float(m.group(2)) for m in _LOSS_RE.finditer(text)}


def per_iteration(logged: dict[int, float]) -> dict[int, float]:
    """Undo the averaging quirk of megatron-core 0.19.2's training_log.

    The first logged iteration of a launch does not reset the accumulators, so
    with ``--log-interval 1`` the second one shows the mean of the first two;
    it is replaced by ``2 * logged - first`` (good to the printed 7 digits).
    """
    its = sorted(logged)
    out = dict(logged)
    if len(its) >= 2 and its[1] == its[0] + 1:
        out[its[1]] = 2.0 * logged[its[1]] - logged[its[0]]
    return out


# -- launching -----------------------------------------------------------------------------
def launch(entry_args: list[str], *, nproc: int, run_dir: Path, env: dict[str, str] | None = None,
           timeout: float = 300.0) -> RunResult:
    """``torchrun --nproc-per-node nproc -m zephon_megatron.cpu.entry entry_args`` (free port, hard timeout)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "train.log"
    cmd = [
        "timeout", "-k", "15", str(int(timeout)),
        python_exe(), "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", uuid.uuid4().hex,
        "--max-restarts", "0",
        "-m", "zephon_megatron.cpu.entry", *entry_args,
    ]
    full_env = dict(os.environ)
    full_env.update(CPU_ENV)
    full_env["PYTHONPATH"] = pythonpath() + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    full_env["ZEPHON_BATCH_LOG"] = str(run_dir / "batches-rank{rank}.log")
    full_env["ZEPHON_CACHE_DIR"] = str(run_dir.parent / "index-cache")
    if env:
        full_env.update(env)
    start = time.monotonic()
    timed_out = False
    with open(log_path, "w") as log:
        log.write("# " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True, cwd=str(run_dir))
        try:
            rc = proc.wait(timeout=timeout + 30)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
        except BaseException:  # Ctrl-C or a test's own timeout: never leave the ranks running
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    wall = time.monotonic() - start
    timed_out = timed_out or rc in (124, 137)
    return RunResult(rc, wall, run_dir, log_path, timed_out, log_path.read_text(errors="replace"))


def tiny_gpt_flags(*, tp: int = 1, pp: int = 1, train_iters: int | None = 6, seed: int = 1234, cp: int = 1, layers: int = 2,
                   layers_per_virtual_stage: int | None = None, gbs: int | None = GBS) -> list[str]:
    """Megatron flags for a tiny GPT (2 layers, hidden 64) over the bundled BPE's vocabulary.

    ``gbs`` None leaves ``--global-batch-size`` out (``--step-batch-size-schedule`` excludes it),
    ``train_iters`` None ``--train-iters`` (for a run sized with ``--train-samples``).
    """
    sizes = ["--global-batch-size", str(gbs)] if gbs is not None else []
    if train_iters is not None:
        sizes += ["--train-iters", str(train_iters)]
    if cp > 1:
        sizes += ["--context-parallel-size", str(cp)]
    if layers_per_virtual_stage is not None:
        sizes += ["--num-layers-per-virtual-pipeline-stage", str(layers_per_virtual_stage)]
    return [
        *CPU_FLAGS,
        "--tensor-model-parallel-size", str(tp),
        "--pipeline-model-parallel-size", str(pp),
        "--num-layers", str(layers), "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ),
        "--micro-batch-size", str(MBS), *sizes,
        "--lr", "1e-3", "--min-lr", "1e-3", "--lr-decay-style", "constant",
        "--seed", str(seed),
        "--use-cpu-initialization",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
        "--log-interval", "1",
        "--ckpt-format", "torch",
    ]


@dataclass
class Zrun:
    """One Zephon-fed launch's settings (``run`` turns them into a command)."""

    route: str  # "launch" | "wheel"
    nproc: int
    recipe: Path
    tp: int = 1
    pp: int = 1
    cp: int = 1
    layers: int = 2
    layers_per_virtual_stage: int | None = None
    gbs: int | None = GBS  # None: the batch size comes from a schedule in ``extra``
    train_iters: int | None = 6  # None: ``--train-samples`` in ``extra``
    save_interval: int | None = None
    load: Path | None = None  # a checkpoint folder ...
    load_step: int | None = None  # ... and the iteration to resume from
    loader_states_from: Path | None = None  # copied into this run's --dataloader-save first
    aggregate_dir: Path | None = None
    valid_recipe: Path | list[Path] | None = None
    eval_interval: int = 1000
    eval_iters: int = 0
    extra: list[str] = field(default_factory=list)
    no_attention_mask_flag: bool = True  # pass --no-create-attention-mask-in-dataloader


def run(workdir: Path, name: str, z: Zrun, *, timeout: float = 300.0) -> RunResult:
    run_dir = Path(workdir) / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    dls = run_dir / "loader"
    if z.loader_states_from is not None:
        shutil.copytree(z.loader_states_from, dls)
    args = tiny_gpt_flags(tp=z.tp, pp=z.pp, train_iters=z.train_iters, cp=z.cp, layers=z.layers,
                          layers_per_virtual_stage=z.layers_per_virtual_stage, gbs=z.gbs)
    args += ["--zephon-recipe", str(z.recipe), "--dataloader-save", str(dls),
             "--zephon-aggregate-dir", str(z.aggregate_dir or (Path(workdir) / "aggregate")), "--zephon-run-id", "e2e",
             "--eval-iters", str(z.eval_iters), "--eval-interval", str(z.eval_interval)]
    if z.valid_recipe is not None:
        recipes = z.valid_recipe if isinstance(z.valid_recipe, list) else [z.valid_recipe]
        args += ["--zephon-valid-recipe", *map(str, recipes)]
    if z.no_attention_mask_flag:
        args.append("--no-create-attention-mask-in-dataloader")
    if z.save_interval is not None:
        args += ["--save", str(run_dir / "ckpt"), "--save-interval", str(z.save_interval)]
    if z.load is not None:
        args += ["--load", str(z.load)]
        if z.load_step is not None:
            args += ["--ckpt-step", str(z.load_step)]
    args += z.extra
    if z.route == "launch":
        entry = ["launch", str(STAND_IN), "--dataloader-type", "zephon", *args]
    elif z.route == "wheel":
        entry = ["wheel", *args]
    else:
        raise ValueError(z.route)
    return launch(entry, nproc=z.nproc, run_dir=run_dir, timeout=timeout)


# -- checkpoints ----------------------------------------------------------------------------
def model_tensors(ckpt: Path, iteration: int) -> dict[str, dict[str, object]]:
    """Per model-parallel file of a ``--ckpt-format torch`` checkpoint: parameter name -> tensor."""
    import torch

    out = {}
    for f in sorted((Path(ckpt) / f"iter_{iteration:07d}").glob("mp_rank_*/model_optim_rng.pt")):
        sd = torch.load(f, map_location="cpu", weights_only=False)  # our own test files (they hold an argparse Namespace)
        # One "model" entry, or "model0", "model1", ... per virtual pipeline chunk.
        chunks = sorted(k for k in sd if k == "model" or (k.startswith("model") and k[5:].isdigit()))
        out[f.parent.name] = {f"{c}/{k}": v for c in chunks for k, v in sd[c].items() if isinstance(v, torch.Tensor)}
    return out


def param_differences(a: Path, b: Path, iteration: int) -> list[str]:
    """Names of model tensors that are not bitwise equal between two checkpoints at ``iteration``."""
    import torch

    ta, tb = model_tensors(a, iteration), model_tensors(b, iteration)
    if not ta or set(ta) != set(tb):
        return [f"checkpoint files differ: {sorted(ta)} vs {sorted(tb)}"]
    out = []
    for part in ta:
        for k in sorted(set(ta[part]) | set(tb[part])):
            x, y = ta[part].get(k), tb[part].get(k)
            if x is None or y is None or x.shape != y.shape or not torch.equal(x, y):
                out.append(f"{part}/{k}")
    return out


# -- test data ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Assets:
    indexed_recipe: Path  # Megatron .bin/.idx, pretokenized with an EOD after every document
    text_recipe: Path  # JSON lines of space-separated ids, tokenized by Megatron's NullTokenizer
    heldout_recipe: Path  # held-out .bin/.idx, one pass, no shuffle


def _tokenize_corpus(path: Path, limit: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(CORPUS / "tokenizer.json"))
    texts = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                texts.append(json.loads(line)["text"])
            if len(texts) >= limit:
                break
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False) if e.ids]


def _write_indexed(prefix: Path, docs: list[list[int]], eod: int) -> None:
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.uint16)
    for ids in docs:
        arr = np.asarray(ids + [eod], dtype=np.int64)  # as preprocess_data.py --append-eod
        builder.add_document(arr, [len(arr)])
    builder.finalize(str(prefix) + ".idx")


def make_heldout_sets(root: Path) -> list[Path]:
    """Two held-out recipes over halves of the held-out corpus (one loss per set with --multiple-validation-sets)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    docs = _tokenize_corpus(CORPUS / "stdlib_docs_heldout.jsonl", 16)  # small: every evaluation reads both sets whole
    out = []
    for name, part in (("heldout_a", docs[: len(docs) // 2]), ("heldout_b", docs[len(docs) // 2 :])):
        _write_indexed(root / f"{name}_text_document", part, VOCAB - 1)
        (root / f"{name}.toml").write_text(
            'seed = 1\nchunk_size = 4\nexhausted = "stop"\nshuffle_documents = false\n\n'
            f'[[sources]]\npath = "{name}_text_document"\nformat = "megatron"\n')
        out.append(root / f"{name}.toml")
    return out


def make_assets(root: Path) -> Assets:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    eod = VOCAB - 1
    train_docs = _tokenize_corpus(CORPUS / "stdlib_docs.jsonl", 400)
    held_docs = _tokenize_corpus(CORPUS / "stdlib_docs_heldout.jsonl", 60)
    _write_indexed(root / "stdlib_text_document", train_docs, eod)
    _write_indexed(root / "heldout_text_document", held_docs, eod)
    with open(root / "stdlib_ids.jsonl", "w", encoding="utf-8") as f:
        for ids in train_docs:
            f.write(json.dumps({"text": " ".join(map(str, ids))}) + "\n")
    common = f"seed = 20261129\nchunk_size = 16\ncanonical_replicas = {C}\n\n[shuffle]\nwindow = 4\nseed = 3\n"
    (root / "mg_e2e_indexed.toml").write_text(
        common + '\n[[sources]]\npath = "stdlib_text_document"\nformat = "megatron"\n')
    (root / "mg_e2e_text.toml").write_text(
        common + '\n[[sources]]\npath = "stdlib_ids.jsonl"\nformat = "jsonl"\ntext_field = "text"\n')
    (root / "mg_e2e_heldout.toml").write_text(
        'seed = 1\nchunk_size = 8\nexhausted = "stop"\nshuffle_documents = false\n\n'
        '[[sources]]\npath = "heldout_text_document"\nformat = "megatron"\n')
    return Assets(root / "mg_e2e_indexed.toml", root / "mg_e2e_text.toml", root / "mg_e2e_heldout.toml")
