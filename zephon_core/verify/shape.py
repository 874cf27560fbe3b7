"""The pipeline a run built, rebuilt from its recipe and its shape, whether standalone or training.

A ``[standalone]`` recipe names its tokenizer, ``seq_len`` and batch size; a
training recipe leaves them to the framework, so the command line takes them
as ``--tokenizer``, ``--seq-len`` and ``--batch-size``, and ``--framework``
says whose conventions to follow, so that ``zephon trace`` prints the digests
that framework's run logs. Each framework's conventions are declared once, as data, in
``integration.frameworks`` (registered as ``zephon.frameworks`` entry points); ``framework_of`` matches a
checkpoint's definition against them. TorchTitan's and Megatron's:

============  ======================================  =========================  ===================================
framework     special tokens around each document     ``--seq-len`` default      ``--batch-size`` default
============  ======================================  =========================  ===================================
torchtitan    BOS and EOS (``tokenizer_config.json``)  2048 (``training.seq_len``)  8 (``training.local_batch_size``)
megatron      EOD only (the config's ``eos_token``)    none (``--seq-length``)     none (``--micro-batch-size``)
============  ======================================  =========================  ===================================

``--tokenizer`` is what the run's tokenizer reads: a ``tokenizer.json`` or its
folder (TorchTitan's ``hf_assets_path``, Megatron's ``--tokenizer-model`` with
``--tokenizer-type HuggingFaceTokenizer``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zephon_core.curriculum.definition import parse_definition
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.errors import ConfigError
from zephon_core.integration.frameworks import conventions, framework_names
from zephon_core.lane.tokenizer_file import load_tokenizer, special_token_ids
from zephon_core.pipeline import Pipeline
from zephon_core.recipe import Recipe


@dataclass(frozen=True)
class Shape:
    """What the command line was told about the run (None: not given)."""

    tokenizer: str | None = None
    seq_len: int | None = None
    batch_size: int | None = None
    framework: str | None = None

    def filled_from(self, definition: Mapping[str, Any] | None) -> Shape:
        """This shape; a seq_len or batch size not given comes from a checkpoint's ``definition``."""
        if not definition:
            return self
        d = parse_definition(definition)
        return Shape(self.tokenizer, self.seq_len or d.seq_len, self.batch_size or d.batch_size, self.framework)


def work_source(recipe: Recipe, shape: Shape) -> WorkSource:
    """A training recipe's curriculum without its pipeline, for what reads no batch (``zephon report``).

    It needs the run's shape only where a stage counts tokens of text (the run's tokenizer makes them)
    or starts at an optimizer step (``seq_len`` makes a step's tokens); each need is refused naming the options.
    """
    stages = recipe.stages()
    counts_tokens = recipe.spec.weight_by == "tokens" or any(
        st.weight_by == "tokens" or st.start_tokens is not None or st.start_step is not None for st in stages)
    if counts_tokens and not recipe.pretokenized:
        raise ConfigError(f"{recipe.path}: its stages count tokens, as the run's tokenizer makes them: pass "
                          "--framework, --tokenizer, --seq-len and --batch-size as the run has them")
    if shape.seq_len is None and any(st.start_step is not None for st in stages):
        raise ConfigError(f"{recipe.path}: a stage starts at an optimizer step (start_step): pass --seq-len as the "
                          "run has it")
    return recipe.work_source(shape.seq_len)


def build(recipe: Recipe, shape: Shape, **options: Any) -> Pipeline:
    """The pipeline ``recipe`` defines for the run ``shape`` describes; ``options`` go to ``Pipeline.options``."""
    if recipe.spec.standalone is not None and shape.framework is None:
        return _standalone(recipe, shape, options)
    return _training(recipe, shape, options)


def _standalone(recipe: Recipe, shape: Shape, options: dict[str, Any]) -> Pipeline:
    st = recipe.spec.standalone
    assert st is not None
    tokenizer = None
    if not recipe.pretokenized:
        path = shape.tokenizer or (recipe.resolve(st.tokenizer) if st.tokenizer else None)
        if path is None:
            raise ConfigError(f"{recipe.path}: standalone.tokenizer: text sources need a tokenizer; set it, or pass --tokenizer")
        tokenizer = load_tokenizer(path, "--tokenizer" if shape.tokenizer else f"{recipe.path}: standalone.tokenizer")
    return recipe.build(seq_len=shape.seq_len or st.seq_len, batch_size=shape.batch_size or st.batch_size, tokenizer=tokenizer,
                        bos_id=st.bos_id, eos_id=st.eos_id, **options)


def _training(recipe: Recipe, shape: Shape, options: dict[str, Any]) -> Pipeline:
    if shape.framework is None:
        raise ConfigError(
            f"{recipe.path} is a training recipe (no [standalone]): pass --framework {' or '.join(framework_names())} "
            "(whose tokenization and default sizes to follow), with --tokenizer, --seq-len and --batch-size as the run has them"
        )
    conv = conventions(shape.framework)
    seq_len = shape.seq_len or conv.seq_len
    batch_size = shape.batch_size or conv.batch_size
    missing = [f"--seq-len (the run's {conv.seq_len_flag})"] if seq_len is None else []
    missing += [f"--batch-size (the run's {conv.batch_size_flag})"] if batch_size is None else []
    if not recipe.pretokenized and not shape.tokenizer:
        missing.insert(0, f"--tokenizer (the run's {conv.tokenizer_flag}: a tokenizer.json or its folder)")
    if missing:
        raise ConfigError(f"{recipe.path}: {shape.framework} has no default for this; pass {', '.join(missing)}")
    assert seq_len is not None and batch_size is not None
    tokenizer = bos = eos = None
    if not recipe.pretokenized:
        assert shape.tokenizer is not None
        tokenizer = load_tokenizer(shape.tokenizer, "--tokenizer")
        bos, eos = special_token_ids(shape.tokenizer, tokenizer)
        bos, eos = (bos if conv.bos else None), (eos if conv.eos else None)
    return recipe.build(seq_len=seq_len, batch_size=batch_size, tokenizer=tokenizer, bos_id=bos, eos_id=eos, **options)
