"""The recipe's schema: one dataclass per TOML table, read by OmegaConf (an unknown key or a wrong type is refused
naming the key). Behaviour lives in ``zephon_core.recipe``; these say only what may be written."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from zephon_core.sources.registry import DEFAULT_FORMAT


@dataclass
class SourceSpec:
    path: Optional[str] = None
    paths: Optional[list[str]] = None
    format: str = DEFAULT_FORMAT  # a registered format (sources/registry.py)
    weight: float = 1.0
    text_field: str = "text"
    offsets: Optional[str] = None  # token_array: the .npy of document offsets
    name: Optional[str] = None


@dataclass
class ShuffleSpec:
    window: int = 0
    seed: int = 0


@dataclass
class AggregateSpec:
    dir: Optional[str] = None
    run_id: Optional[str] = None
    timeout_s: float = 180.0


@dataclass
class ExecutionSpec:
    parallelism: int = 1
    runner: str = "thread"
    prefetch: int = 0
    readahead: int = 1


@dataclass
class StandaloneSpec:
    tokenizer: Optional[str] = None
    seq_len: int = 128
    batch_size: int = 4
    bos_id: Optional[int] = None
    eos_id: Optional[int] = None


@dataclass
class StageSpec:
    name: str = "???"
    weights: dict[str, float] = field(default_factory=dict)
    start_tokens: Optional[int] = None
    start_step: Optional[int] = None
    weight_by: Optional[str] = None  # default: the recipe's weight_by


@dataclass
class MixingSpec:
    """``[mixing]``: a mixture the run steers by its losses (``pipeline.mixing.Mixing.from_table``).

    The keys every controller shares (``curriculum.controller_registry.COMMON_KEYS``); the table's other keys
    are the chosen controller's own, which it declares and checks itself: ``load_recipe`` moves them into
    ``controller_keys`` (not a key a recipe writes)."""

    controller: str = "identity"  # a registered name, an entry point's, or a "module:Class" path
    interval_steps: Optional[int] = None
    interval_tokens: Optional[int] = None
    min_share: float = 0.0
    max_change: float = 1.0
    margin_chunks: int = 0
    weight_by: str = "tokens"
    controller_keys: dict[str, Any] = field(default_factory=dict)  # identity: weights; schedule: schedule; odm: alpha


@dataclass
class SurgerySpec:
    """``[surgery]``: data the run leaves out from where it resumes, journaled in the checkpoint state by the adapters
    (``zephon_core.pipeline.surgery.apply_surgery``); not part of the data's definition, so not fingerprinted."""

    skip_steps: list[str] = field(default_factory=list)  # global steps "A..B" (from 1, inclusive) or "A"
    quarantine: list[str] = field(default_factory=list)  # documents "SOURCE#N"


@dataclass
class RecipeSpec:
    sources: list[SourceSpec] = field(default_factory=list)
    stages: list[StageSpec] = field(default_factory=list)
    weight_by: str = "documents"
    global_batch_size: Optional[int] = None
    seed: int = 0
    chunk_size: int = 64
    exhausted: str = "repeat"
    shuffle_documents: bool = True
    block_size: int = 0
    block_window: int = 8
    pack_mode: str = "concat"
    pack_window: Optional[int] = None  # the fit modes' window of documents (1024 when not given)
    pack_overlong: str = "split"
    max_docs_per_row: int = 0
    canonical_replicas: Optional[int] = None
    shuffle: ShuffleSpec = field(default_factory=ShuffleSpec)
    aggregate: AggregateSpec = field(default_factory=AggregateSpec)
    execution: ExecutionSpec = field(default_factory=ExecutionSpec)
    standalone: Optional[StandaloneSpec] = None
    mixing: Optional[MixingSpec] = None
    surgery: SurgerySpec = field(default_factory=SurgerySpec)
