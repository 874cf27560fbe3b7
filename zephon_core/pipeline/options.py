"""``Pipeline.options``: every setting, its default and its check, and the identities they resolve to."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from zephon_core.errors import ConfigError
from zephon_core.lane.assignment import owned_lanes
from zephon_core.validation import require_int, require_positive_number

DEFAULT_AGGREGATE_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Options:
    """Everything set through ``Pipeline.options``.

    Data identity and lanes decide which samples a pipeline produces;
    coordination identity decides how it checkpoints; execution options never
    change the data.
    """

    dp_degree: int | None = None
    """Data-parallel groups in the run (the framework's DP size); default ``world_size``."""
    dp_group_id: int | None = None
    """This pipeline's group, ``0 .. dp_degree - 1``; default ``global_rank``."""
    world_size: int = 1
    """Pipelines that checkpoint together (exactly those that call ``checkpoint()``)."""
    global_rank: int = 0
    """This pipeline among them; rank 0 merges everyone's progress."""
    canonical_replicas: int | None = None
    """Lanes, fixed for the life of a run; default: the first ``dp_degree`` (or the restored state's)."""
    aggregate_dir: str | None = None
    """Shared folder or object-store prefix where ranks merge checkpoints; needed when ``world_size > 1``."""
    run_id: str | None = None
    """This run's folder under ``aggregate_dir``: 1-128 of letters, digits, ``.``, ``_``, ``-``."""
    aggregate_timeout_s: float = DEFAULT_AGGREGATE_TIMEOUT_S
    """Seconds rank 0 waits for every rank at a checkpoint before failing, naming the missing ones."""
    storage_options: Mapping[str, Any] | None = field(default=None, hash=False)
    """fsspec storage options for ``aggregate_dir`` (e.g. an S3 endpoint)."""
    prefetch: int = 0
    """Batches packed ahead by a thread of their own (0: in the caller's thread, usually fastest)."""
    readahead: int = 1
    """Pieces per lane read and tokenized ahead on the reader threads."""
    reader_threads: int = 1
    """Threads that read ahead (0: everything in the caller's thread)."""
    pipelines_per_node: int | None = None
    """Pipelines sharing a node, for ``explain()``'s per-node totals; default ``LOCAL_WORLD_SIZE``."""


OPTION_NAMES = tuple(f.name for f in fields(Options))

_RUN_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def validate_run_id(run_id: Any) -> str:
    """A run_id names one folder under aggregate_dir and must not escape it."""
    if not isinstance(run_id, str) or not run_id:
        raise ConfigError(f"option run_id must be a non-empty string, got {run_id!r}")
    bad = sorted(set(run_id) - _RUN_ID_CHARS)
    if bad or run_id in (".", "..") or run_id.startswith(".") or len(run_id) > 128:
        raise ConfigError(
            f"option run_id {run_id[:40]!r}{'...' if len(run_id) > 40 else ''} must be 1-128 characters of letters, digits, '.', '_' "
            "or '-', not start with '.', so it cannot escape aggregate_dir"
        )
    return run_id


@dataclass(frozen=True)
class Identity:
    """Resolved identities of one pipeline instance."""

    dp_degree: int
    dp_group_id: int
    world_size: int
    global_rank: int
    canonical_replicas: int

    @property
    def lanes(self) -> list[int]:
        """The lanes this pipeline's data-parallel group owns, in delivery order."""
        return owned_lanes(self.canonical_replicas, self.dp_degree, self.dp_group_id)

    @property
    def uneven(self) -> bool:
        """Groups own different numbers of lanes: steps then depend on ``dp_degree``."""
        return self.canonical_replicas % self.dp_degree != 0


def _opt(name: str, value: Any, minimum: int) -> int:
    return require_int(value, f"option {name}", minimum)


def resolve_identity(opts: Options, canonical_replicas: int | None = None) -> Identity:
    """Defaults and validation of data and coordination identity (and of every other option)."""
    world_size = _opt("world_size", opts.world_size, 1)
    global_rank = _opt("global_rank", opts.global_rank, 0)
    if global_rank >= world_size:
        raise ConfigError(f"option global_rank={global_rank} must be below world_size={world_size}")
    dp_degree = _opt("dp_degree", world_size if opts.dp_degree is None else opts.dp_degree, 1)
    dp_group_id = _opt("dp_group_id", global_rank if opts.dp_group_id is None else opts.dp_group_id, 0)
    if dp_group_id >= dp_degree:
        raise ConfigError(f"option dp_group_id={dp_group_id} must be below dp_degree={dp_degree}")
    if canonical_replicas is None:
        canonical_replicas = dp_degree if opts.canonical_replicas is None else opts.canonical_replicas
    C = _opt("canonical_replicas", canonical_replicas, 1)
    if dp_degree > C:
        raise ConfigError(
            f"dp_degree={dp_degree} exceeds canonical_replicas={C}: a run can never have more data-parallel groups than lanes; "
            "choose canonical_replicas for the largest dp_degree the run will reach"
        )
    if world_size > 1:
        if not opts.aggregate_dir:
            raise ConfigError(f"world_size={world_size} needs option aggregate_dir (a shared directory or object-store prefix) to checkpoint")
        if opts.run_id is None:
            raise ConfigError(f"world_size={world_size} needs option run_id, unique to this training run")
    if opts.run_id is not None:
        validate_run_id(opts.run_id)
    require_positive_number(opts.aggregate_timeout_s, "option aggregate_timeout_s")
    _opt("prefetch", opts.prefetch, 0)
    _opt("readahead", opts.readahead, 0)
    _opt("reader_threads", opts.reader_threads, 0)
    if opts.pipelines_per_node is not None:
        _opt("pipelines_per_node", opts.pipelines_per_node, 1)
    return Identity(dp_degree, dp_group_id, world_size, global_rank, C)


def default_pipelines_per_node() -> int:
    """``LOCAL_WORLD_SIZE`` (set by torchrun), else 1."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1
