"""The dataset provider and the iterators Megatron trains and evaluates from.

Which ranks build a Pipeline: tensor-parallel rank 0 of the first and of the
last pipeline stage (of every stage when the batches carry per-document
sequence information, ``--dataloader-inter-document-masking``). Other
tensor-parallel ranks receive each micro-batch by broadcast. The first and
last stages of one data-parallel rank build identical Pipelines and so read
identical streams.

Identities: one Pipeline per data-parallel rank takes part in a checkpoint —
the first stage's, which Megatron's checkpoint hook asks for ``save_state()``
— so ``dp_degree = world_size = DP size`` and ``dp_group_id = global_rank =
DP rank``; the other stages' Pipelines never coordinate (``world_size=1``).

The provider is marked ``is_distributed`` so Megatron calls it on every rank:
every rank runs the same start-up checks (and reads the resumed loader state),
so a refusal stops all ranks alike instead of leaving some waiting in a
collective.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from zephon_core import Batch, Pipeline
from zephon_core.integration import Coordination, load_training_recipe, resolve_coordination
from zephon_core.recipe import Recipe
from zephon_core.tools import audit as batch_audit
from zephon_megatron import state as loader_state
from zephon_megatron.args import Settings, fill_eval_interval, is_requested, to_external
from zephon_megatron.batches import BatchFormat, to_megatron, to_torch
from zephon_megatron.broadcast import BatchMeta, MicroBatch
from zephon_megatron.validate import RunShape, ZephonMegatronError, check

#: Set by the entry point: True when the training script's get_batch uses
#: Megatron's get_batch_on_this_tp_rank (zephon_megatron.launch), False for
#: zephon_megatron.pretrain_gpt (its own broadcast).
ROUTE = {"megatron_broadcast": True}


# -- the tokenizer ------------------------------------------------------------------
def _file_digest(path: str) -> str | None:
    h = hashlib.sha256()
    if os.path.isfile(path):
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    if os.path.isdir(path):
        for root, _dirs, files in sorted(os.walk(path)):
            for name in sorted(files):
                p = os.path.join(root, name)
                h.update(os.path.relpath(p, path).encode() + b"\0")
                with open(p, "rb") as f:
                    h.update(f.read())
        return h.hexdigest()
    return None


def megatron_tokenizer_identity(tok: Any) -> str:
    """A content identity for a Megatron tokenizer, recorded in the data fingerprint.

    It uses the tokenizer's ``unique_identifiers`` (what Megatron keys its own
    dataset caches on) with the tokenizer path replaced by a hash of the files
    it names, so moving a tokenizer between a run and its resume is fine but
    changing it is caught.
    """
    ids: dict[str, Any] = {"class": f"{type(tok).__module__}.{type(tok).__qualname__}"}
    try:
        unique = getattr(tok, "unique_identifiers", None)
    except Exception:  # some tokenizers compute it lazily and may fail
        unique = None
    if unique:
        ids.update({str(k): str(v) for k, v in dict(unique).items()})
    path = ids.pop("tokenizer_path", None)
    if path not in (None, "None", ""):
        ids["tokenizer_content"] = _file_digest(str(path)) or str(path)
    return "megatron:" + hashlib.sha256(json.dumps(ids, sort_keys=True).encode()).hexdigest()[:32]


class TokenizerAdapter:
    """Encodes documents the way Megatron's ``preprocess_data.py`` does: ``tokenizer.tokenize(text)``."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.zephon_identity = megatron_tokenizer_identity(tokenizer)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self._tok.tokenize(text)]

    def __reduce__(self) -> Any:  # for runner="process"
        return (TokenizerAdapter, (self._tok,))


def tokenizer_eod(tokenizer: Any) -> int | None:
    for name in ("eod", "eos_id", "eos"):
        try:
            value = getattr(tokenizer, name, None)
        except Exception:
            value = None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


# -- the audit log --------------------------------------------------------------------
def open_batch_log() -> Any:
    """``zephon_core.tools.audit``'s log for this process's global rank (None when unset)."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return batch_audit.open_batch_log(rank)


# -- iterators ------------------------------------------------------------------------
def _micro_batch(b: Batch, fmt: BatchFormat, *, audit: bool = True) -> MicroBatch:
    """Convert; ``audit`` attaches the batch's identity (training batches only: peers log it)."""
    mb = MicroBatch(to_torch(to_megatron(b, fmt)))
    if mb.get("cu_seqlens") is None:
        dict.pop(mb, "cu_seqlens", None)
        dict.pop(mb, "max_seqlen", None)
    mb.meta = BatchMeta(b.lane, b.lane_index, b.digest) if audit else None
    return mb


class ZephonTrainIterator:
    """Megatron's external training iterator: ``next()`` gives one micro-batch dict.

    ``save_state()`` is called by Megatron's checkpoint hook after an optimizer
    step; on the Pipelines that coordinate it is collective over the
    data-parallel ranks.
    """

    def __init__(self, pipeline: Pipeline, fmt: BatchFormat, *, start_iteration: int, num_microbatches: int,
                 batches_per_step: int, saves: bool) -> None:
        self.pipeline = pipeline
        self.fmt = fmt
        self.start_iteration = start_iteration
        self.num_microbatches = num_microbatches
        self.batches_per_step = batches_per_step
        self.saves = saves
        self.delivered = 0  # micro-batches handed out by this launch
        self._it: Iterator[Batch] | None = None
        self._log = open_batch_log()

    def __iter__(self) -> ZephonTrainIterator:
        return self

    def __next__(self) -> MicroBatch:
        if self._it is None:
            self._it = iter(self.pipeline)
        b = next(self._it)
        self.delivered += 1
        if self._log is not None:
            self._log.write(batch_audit.log_line(b))
        return _micro_batch(b, self.fmt)

    @property
    def iteration(self) -> int:
        """Optimizer steps completed, counting from the start of the run."""
        return self.start_iteration + self.delivered // self.num_microbatches

    def save_state(self) -> dict[str, Any]:
        if not self.saves:
            raise RuntimeError(
                "zephon: save_state() was called on a loader that does not coordinate checkpoints (only tensor-parallel "
                "rank 0 of the first pipeline stage saves the loader state)"
            )
        if self.delivered % self.num_microbatches:
            raise RuntimeError(
                f"zephon: save_state() after {self.delivered} micro-batches, in the middle of an optimizer step of "
                f"{self.num_microbatches}; the loader state can only be saved between steps"
            )
        state = self.pipeline.checkpoint()
        delivered = sum(v["delivered"] for v in state["lanes"].values())
        if delivered != self.iteration * self.batches_per_step:
            raise RuntimeError(
                f"zephon: the merged loader state holds {delivered} micro-batches at iteration {self.iteration}, expected "
                f"{self.iteration} x {self.batches_per_step}; data-parallel ranks consumed different amounts"
            )
        return loader_state.encode(state, iteration=self.iteration, batches_per_step=self.batches_per_step)


class ZephonValidIterator:
    """Megatron's external validation iterator over a held-out recipe.

    Every evaluation consumes ``per_evaluation`` micro-batches; after that many
    (or when the held-out data ends) the stream starts over, so every
    evaluation — before or after a resume — reads exactly the same batches.
    """

    def __init__(self, make_pipeline: Callable[[], Pipeline], fmt: BatchFormat, per_evaluation: int) -> None:
        self._make = make_pipeline
        self.fmt = fmt
        self.per_evaluation = max(1, per_evaluation)
        self._pipeline: Pipeline | None = None
        self._it: Iterator[Batch] | None = None
        self._n = 0

    def __iter__(self) -> ZephonValidIterator:
        return self

    def _restart(self) -> None:
        if self._pipeline is not None:
            self._pipeline.close()
        self._pipeline = self._make()
        self._it = iter(self._pipeline)
        self._n = 0

    def __next__(self) -> MicroBatch:
        if self._it is None or self._n >= self.per_evaluation:
            self._restart()
        assert self._it is not None
        try:
            b = next(self._it)
        except StopIteration:
            if self._n == 0:
                raise ZephonMegatronError("zephon: the held-out recipe yields no batch of this micro-batch size") from None
            self._restart()
            b = next(self._it)
        self._n += 1
        return _micro_batch(b, self.fmt, audit=False)

    def save_state(self) -> None:  # validation has no state to keep
        return None


# -- building ---------------------------------------------------------------------------
def _recipe(path: str, what: str) -> Recipe:
    return load_training_recipe(path, framework="Megatron", role=what, error=ZephonMegatronError)


def coordination(settings: Settings, recipe: Recipe, resumed: loader_state.LoaderState | None, dp: int) -> Coordination:
    """Lanes and aggregation: the flags, else the recipe's, else (lanes) the resumed state's, else DP."""
    return resolve_coordination(
        recipe, dp_degree=dp, canonical_replicas=settings.canonical_replicas, aggregate_dir=settings.aggregate_dir,
        run_id=settings.run_id, resumed_state=resumed.state if resumed is not None else None,
    )


def shape_of(args: Any, settings: Settings, recipe: Recipe | None, *, C: int | None,
             num_microbatches: int | None = None) -> RunShape:
    if recipe is not None:
        coord = coordination(settings, recipe, None, int(args.data_parallel_size))
        agg_dir, run_id = coord.aggregate_dir, coord.run_id
    else:
        agg_dir, run_id = settings.aggregate_dir, settings.run_id
    return RunShape.from_args(args, canonical_replicas=C, num_microbatches=num_microbatches, valid_recipe=settings.valid_recipe,
                              aggregate_dir=agg_dir, run_id=run_id, megatron_broadcast=ROUTE["megatron_broadcast"])


def prepare(args: Any) -> bool:
    """Map ``zephon`` to ``external`` and run the checks possible from the arguments alone.

    Called at ``pretrain()`` entry, on every rank; the provider repeats the
    full checks once the lane count and the micro-batch count are final.
    Returns False (and does nothing) when Zephon is not selected.
    """
    if not is_requested(args):
        return False
    to_external(args)
    fill_eval_interval(args)
    settings = Settings.from_args(args)
    recipe = _recipe(settings.recipe, "--zephon-recipe")
    C = settings.canonical_replicas or recipe.spec.canonical_replicas
    if C is None and not getattr(args, "load", None):
        C = int(args.data_parallel_size)  # a fresh run: the default the provider will use too
    check(shape_of(args, settings, recipe, C=C))
    return True


def _print_rank0(msg: str) -> None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
        print(msg, flush=True)


def provide(args: Any) -> tuple[Any, Any, Any]:
    """Build this rank's train and validation iterators (or Nones)."""
    from megatron.core import mpu
    from megatron.core.num_microbatches_calculator import get_num_microbatches

    prepare(args)
    settings = Settings.from_args(args)
    recipe = _recipe(settings.recipe, "--zephon-recipe")
    tp_rank = mpu.get_tensor_model_parallel_rank()
    first = mpu.is_pipeline_first_stage(ignore_virtual=True)
    last = mpu.is_pipeline_last_stage(ignore_virtual=True)
    dp = mpu.get_data_parallel_world_size()
    dp_rank = mpu.get_data_parallel_rank()
    pp = mpu.get_pipeline_model_parallel_world_size()
    nmb = get_num_microbatches()
    bps = nmb * dp

    resumed = None
    iteration = int(getattr(args, "iteration", 0) or 0)
    if iteration > 0:
        resumed = loader_state.load_for_iteration(settings.dataloader_save, iteration, dp_rank, batches_per_step=bps,
                                                  pipeline_parallel=pp > 1)
        newer = [i for i in loader_state.saved_iterations(settings.dataloader_save or "") if i > iteration]
        if newer:
            _print_rank0(f"zephon: resuming at iteration {iteration}; ignoring loader states of later iterations {newer} "
                         "(their model checkpoints were not the ones loaded)")
    coord = coordination(settings, recipe, resumed, dp)
    C = coord.canonical_replicas
    check(shape_of(args, settings, recipe, C=C, num_microbatches=nmb))

    all_stages = bool(getattr(args, "dataloader_inter_document_masking", False))
    if tp_rank != 0 or not (first or last or all_stages):
        return None, None, None

    tokenizer = None
    eod = None
    try:
        from megatron.training import get_tokenizer

        tokenizer = get_tokenizer()
    except Exception:  # no tokenizer built (e.g. --tokenizer-type not given)
        tokenizer = None
    if tokenizer is not None:
        eod = tokenizer_eod(tokenizer)
    if not recipe.pretokenized and tokenizer is None:
        raise ZephonMegatronError(f"zephon: {settings.recipe} has text sources, which need Megatron's tokenizer (--tokenizer-type ...)")
    if getattr(args, "eod_mask_loss", False) and eod is None:
        raise ZephonMegatronError("zephon: --eod-mask-loss needs the tokenizer's end-of-document id; set --tokenizer-type")
    fmt = BatchFormat.from_args(args, eod)
    tok = TokenizerAdapter(tokenizer) if not recipe.pretokenized else None

    saves = first  # Megatron asks tensor-parallel rank 0 of the first stage only
    options: dict[str, Any] = dict(dp_degree=dp, dp_group_id=dp_rank, canonical_replicas=C)
    if saves and dp > 1:
        options.update(world_size=dp, global_rank=dp_rank, aggregate_dir=coord.aggregate_dir, run_id=coord.run_id,
                       aggregate_timeout_s=coord.aggregate_timeout_s)
    pipeline = recipe.build(seq_len=args.seq_length, batch_size=args.micro_batch_size, tokenizer=tok, bos_id=None,
                            eos_id=eod if tok is not None else None, **options)
    if resumed is not None:
        pipeline.restore(resumed.state)
    train = ZephonTrainIterator(pipeline, fmt, start_iteration=iteration, num_microbatches=nmb, batches_per_step=bps,
                                saves=saves)

    valid = None
    eval_iters = int(getattr(args, "eval_iters", 0) or 0)
    if settings.valid_recipe and eval_iters > 0:
        held_out = _recipe(settings.valid_recipe, "--zephon-valid-recipe")
        eval_mbs = int(getattr(args, "eval_micro_batch_size", None) or args.micro_batch_size)
        eval_gbs = int(getattr(args, "eval_global_batch_size", None) or args.global_batch_size)
        per_eval = eval_iters * max(1, eval_gbs // (eval_mbs * dp))
        valid_C = held_out.spec.canonical_replicas or dp

        def make_valid() -> Pipeline:
            return held_out.build(seq_len=args.seq_length, batch_size=eval_mbs, tokenizer=tok, bos_id=None,
                                  eos_id=eod if tok is not None else None, dp_degree=dp, dp_group_id=dp_rank,
                                  canonical_replicas=valid_C)

        valid = ZephonValidIterator(make_valid, fmt, per_eval)
    return train, valid, None


def train_valid_test_datasets_provider(train_val_test_num_samples: Any, vp_stage: int | None = None) -> tuple[Any, Any, Any]:
    """Megatron's dataset provider for Zephon (the sample counts are not needed: the stream is endless)."""
    from megatron.training import get_args

    return provide(get_args())


train_valid_test_datasets_provider.is_distributed = True  # type: ignore[attr-defined]
