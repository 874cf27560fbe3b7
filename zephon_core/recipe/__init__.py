"""Data recipes: TOML files that define a pipeline's data, validated strictly.

    seed = 1234
    chunk_size = 32
    canonical_replicas = 8

    block_size = 0               # > 0: shuffle blocks of consecutive documents (docs/sources_at_scale.md)

    [[sources]]
    path = "corpus/a.jsonl"      # relative paths resolve from the recipe's folder; a glob or a folder
    weight = 0.7                 # format = "jsonl" | "parquet" | "token_array" | "megatron"
                                 # or paths = ["a/*.jsonl.gz", "b/"]: one source over all their files

    [shuffle]                    # optional: shuffle packed rows in windows
    window = 64

    [aggregate]                  # needed when world_size > 1
    dir = "/shared/zephon-agg"
    run_id = "pretrain-7b"

    [execution]                  # never changes the data
    parallelism = 2

    [standalone]                 # only for runs without a framework (demo, CLI);
    tokenizer = "tokenizer.json" # TorchTitan and Megatron supply these themselves
    seq_len = 128
    batch_size = 4

A staged curriculum names its sources and gives the weights per stage
(``docs/curricula.md``): sources then have no ``weight``.

    weight_by = "tokens"         # or "documents" (the default); a stage may override it
    global_batch_size = 512      # rows per optimizer step, needed by start_step

    [[stages]]
    name = "warmup"
    weights = { web = 0.9, code = 0.1 }

    [[stages]]
    name = "anneal"
    start_step = 90000           # or start_tokens = ...
    weights = { web = 0.4, code = 0.3, math = 0.3 }

A ``[surgery]`` table leaves data out from where the run resumes (``docs/when_a_run_goes_wrong.md``):

    [surgery]
    skip_steps = ["1200..1450"]  # global steps, from 1, inclusive
    quarantine = ["web#693"]     # SOURCE#N

A ``[mixing]`` table steers the mixture by the run's losses (``docs/mixing.md``):

    [mixing]
    controller = "odm"           # or "identity" (weights = {...}), "schedule" (schedule = "file.toml"),
                                 # or your own: "mypkg.mixing:MyController" (docs/controllers.md)
    interval_steps = 500         # or interval_tokens = ...
    min_share = 0.05
    max_change = 0.1

The schema is an OmegaConf structured config: an unknown key, a wrong type or
a missing value is an error that names the file and the key.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from zephon_core.curriculum.mixture import EXHAUSTION_POLICIES, StaticMixture
from zephon_core.curriculum.stages import WEIGHT_BY, Stage, StagedMixture, check_stages
from zephon_core.curriculum.token_index import TokenCounter
from zephon_core.curriculum.work_source import WorkSource
from zephon_core.errors import ConfigError, DataError
from zephon_core.lane.docops import token_counter
from zephon_core.lane.ops import PACK_MODES, RUNNERS, PackOp
from zephon_core.lane.tokenizer_file import load_tokenizer
from zephon_core.pipeline import Pipeline
from zephon_core.pipeline.mixing import Mixing
from zephon_core.pipeline.surgery import SurgeryRequest
from zephon_core.recipe.schema import MixingSpec, RecipeSpec, SourceSpec, StageSpec
from zephon_core.sources import Source
from zephon_core.sources.registry import FileSource, SourceArgs, in_recipe, source_format
from zephon_core.validation import require_choice, require_int, require_positive_number


class Recipe:
    """A validated recipe; ``build()`` turns it into a ``Pipeline``."""

    def __init__(self, spec: RecipeSpec, path: str, folder: Path) -> None:
        self.spec = spec
        self.path = path
        self._folder = folder
        self._check()

    def _err(self, key: str, msg: str) -> ConfigError:
        return ConfigError(f"{self.path}: {key}: {msg}")

    def _check(self) -> None:
        s = self.spec
        if not s.sources:
            raise self._err("sources", "at least one [[sources]] entry is required")
        kinds = set()
        for n, src in enumerate(s.sources):
            if (src.path is None) == (src.paths is None):
                raise self._err(f"sources[{n}].path", "give either path (a file, a glob or a folder) or paths (a list of them)")
            if src.paths is not None and not src.paths:
                raise self._err(f"sources[{n}].paths", "must list at least one path")
            fmt = self._format(n)
            problem = fmt.check_args(self._args(n))
            if problem is not None:
                raise self._err(f"sources[{n}].{problem[0]}", problem[1])
            require_positive_number(src.weight, f"{self.path}: sources[{n}].weight")
            kinds.add(fmt.pretokenized)
        if len(kinds) > 1:
            raise self._err("sources", "mixes text and pretokenized sources; use one kind per recipe")
        self._check_stages()
        self.mixing()  # a wrong key, a missing schedule file: refused at load
        self.surgery()
        require_choice(s.exhausted, f"{self.path}: exhausted", EXHAUSTION_POLICIES)
        require_choice(s.pack_mode, f"{self.path}: pack_mode", PACK_MODES)
        try:
            PackOp(1, s.pack_mode, 0, s.pack_window, s.pack_overlong, s.max_docs_per_row)
        except ConfigError as e:
            raise ConfigError(f"{self.path}: {e}") from None
        require_choice(s.execution.runner, f"{self.path}: execution.runner", RUNNERS)
        minimums = [("chunk_size", s.chunk_size, 1), ("shuffle.window", s.shuffle.window, 0), ("execution.parallelism", s.execution.parallelism, 1),
                    ("block_size", s.block_size, 0), ("block_window", s.block_window, 1),
                    ("execution.prefetch", s.execution.prefetch, 0), ("execution.readahead", s.execution.readahead, 0)]
        if s.canonical_replicas is not None:
            minimums.append(("canonical_replicas", s.canonical_replicas, 1))
        if s.global_batch_size is not None:
            minimums.append(("global_batch_size", s.global_batch_size, 1))
        if s.standalone is not None:
            minimums += [("standalone.seq_len", s.standalone.seq_len, 1), ("standalone.batch_size", s.standalone.batch_size, 1)]
        for key, value, low in minimums:
            require_int(value, f"{self.path}: {key}", low)

    def _check_stages(self) -> None:
        s = self.spec
        require_choice(s.weight_by, f"{self.path}: weight_by", WEIGHT_BY)
        if not s.stages:
            return
        for n, src in enumerate(s.sources):
            if not src.name:
                raise self._err(f"sources[{n}].name", "with [[stages]], every source needs a name (the stages' weights refer to it)")
        for n, st in enumerate(s.stages):
            if st.name == "???":
                raise self._err(f"stages[{n}].name", "missing")
            if st.start_step is not None and s.global_batch_size is None:
                raise self._err(f"stages[{n}].start_step", "converting steps to tokens needs global_batch_size (rows per optimizer step) at the top of the recipe")
        # Everything that needs no data is checked now (a large enough tokens_per_step stands in for the real one).
        check_stages(self.stages(), [src.name or "" for src in s.sources], f"{self.path}: stages", tokens_per_step=1)

    def stages(self) -> list[Stage]:
        """The ``[[stages]]`` as ``Stage`` objects (empty for a recipe without them)."""
        return [Stage(dict(st.weights), st.name, None, st.start_tokens, st.start_step, st.weight_by or self.spec.weight_by) for st in self.spec.stages]

    def mixing(self, token_counter: TokenCounter | None = None) -> Mixing | None:
        """The ``[mixing]`` table as ``Mixing`` (None without one): wrap the built pipeline in a ``MixingLoader``."""
        if self.spec.mixing is None:
            return None
        spec = asdict(self.spec.mixing)
        table = {**{k: v for k, v in spec.items() if v is not None and k != "controller_keys"},
                 **spec["controller_keys"]}
        try:
            return Mixing.from_table(table, "mixing", self._folder, token_counter)
        except ConfigError as e:
            raise ConfigError(f"{self.path}: {e}") from None

    def surgery(self) -> SurgeryRequest:
        """The ``[surgery]`` table (empty without one): the adapters journal it once the pipeline is restored."""
        return SurgeryRequest.parse(self.spec.surgery.skip_steps, self.spec.surgery.quarantine, f"{self.path}: surgery")

    def tokens_per_step(self, seq_len: int | None) -> int | None:
        """Tokens one optimizer step packs: global_batch_size rows of seq_len + 1 (None when either is unknown)."""
        gbs = self.spec.global_batch_size
        return gbs * (seq_len + 1) if gbs is not None and seq_len is not None else None

    @property
    def pretokenized(self) -> bool:
        return self._format(0).pretokenized

    def _format(self, n: int) -> type[FileSource]:
        return source_format(self.spec.sources[n].format, f"{self.path}: sources[{n}].format")

    def _args(self, n: int, resolve: bool = False) -> SourceArgs:
        """Source ``n`` as its format takes it; ``resolve``: with its paths resolved from the recipe's folder."""
        src = self.spec.sources[n]
        at = self.resolve if resolve else str
        path = [at(p) for p in src.paths] if src.paths is not None else at(src.path or "")
        offsets = at(src.offsets) if src.offsets else None
        return SourceArgs(path, name=src.name, text_field=src.text_field, offsets=offsets)

    def resolve(self, p: str) -> str:
        """A recipe path: URLs and absolute paths as they are, others from the recipe's folder."""
        if "://" in p or os.path.isabs(p):
            return p
        return str((self._folder / os.path.expanduser(p)).resolve()) if not p.startswith("~") else os.path.expanduser(p)

    def sources(self) -> list[Source]:
        out: list[Source] = []
        for n in range(len(self.spec.sources)):
            fmt, args = self._format(n), self._args(n, resolve=True)
            missing = fmt.explain_missing(args.path) if isinstance(args.path, str) else None
            if missing is not None:
                raise self._err(f"sources[{n}].path", missing)
            try:
                out.append(fmt.from_args(args))
            except DataError as e:
                spec = self.spec.sources[n]
                raise in_recipe(e, str(self.path), n, list_given=spec.paths is not None, fmt=spec.format,
                                folder=args.path if isinstance(args.path, str) else None) from None
        return out

    def work_source(self, seq_len: int | None = None, counter: TokenCounter | None = None) -> WorkSource:
        """The curriculum: a ``StaticMixture``, or a ``StagedMixture`` for ``[[stages]]`` or ``weight_by = "tokens"``.

        ``seq_len`` converts ``start_step`` boundaries to tokens; ``counter``
        counts tokens of text documents (``build`` passes the run's tokenizer).
        """
        s = self.spec
        common: dict[str, Any] = {"seed": s.seed, "chunk_size": s.chunk_size, "exhausted": s.exhausted, "shuffle": s.shuffle_documents,
                                  "block_size": s.block_size or None, "block_window": s.block_window}
        if not s.stages and s.weight_by == "documents":
            return StaticMixture(self.sources(), [src.weight for src in s.sources], **common)
        sources = self.sources()
        stages = self.stages() or [Stage({src.name: w for src, w in zip(sources, [x.weight for x in s.sources])}, "main", weight_by=s.weight_by)]
        if any(st.start_step for st in stages) and seq_len is None:
            raise self._err("stages", "start_step boundaries need the sequence length; build the pipeline (build(seq_len=...)) to resolve them")
        try:
            return StagedMixture(sources, stages, tokens_per_step=self.tokens_per_step(seq_len), token_counter=counter, **common)
        except ConfigError as e:
            raise ConfigError(f"{self.path}: {e}") from None

    def build(
        self,
        *,
        seq_len: int,
        batch_size: int,
        tokenizer: Any = None,
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int = 0,
        global_batch_size: int | None = None,
        **options: Any,
    ) -> Pipeline:
        """The pipeline this recipe defines; ``options`` are passed to ``Pipeline.options``.

        ``global_batch_size``: the framework's rows per optimizer step, refused
        when the recipe plans its stages with another.
        """
        s = self.spec
        if global_batch_size is not None and s.global_batch_size is not None and global_batch_size != s.global_batch_size:
            raise self._err(
                "global_batch_size",
                f"the recipe plans its stages with {s.global_batch_size} rows per optimizer step, this run trains {global_batch_size}; "
                "make them equal (a stage's start_step would otherwise fall at another point of the run)",
            )
        if not self.pretokenized and tokenizer is None:
            raise self._err("sources", "text sources need a tokenizer")
        staged = bool(s.stages) or s.weight_by == "tokens"
        counter = token_counter(tokenizer, bos_id=bos_id, eos_id=eos_id) if staged and not self.pretokenized else None
        p = Pipeline(self.work_source(seq_len, counter))
        if not self.pretokenized:
            p = p.tokenize(tokenizer, bos_id=bos_id, eos_id=eos_id, parallelism=s.execution.parallelism, runner=s.execution.runner)
        p = p.pack(seq_len, mode=s.pack_mode, pad_id=pad_id, window=s.pack_window, overlong=s.pack_overlong,
                   max_docs_per_row=s.max_docs_per_row)
        if s.shuffle.window > 1:
            p = p.shuffle(s.shuffle.window, seed=s.shuffle.seed)
        p = p.batch(batch_size)
        defaults: dict[str, Any] = {"prefetch": s.execution.prefetch, "readahead": s.execution.readahead}
        if s.canonical_replicas is not None:
            defaults["canonical_replicas"] = s.canonical_replicas
        if s.aggregate.dir is not None:
            defaults["aggregate_dir"] = self.resolve(s.aggregate.dir)
        if s.aggregate.run_id is not None:
            defaults["run_id"] = s.aggregate.run_id
        defaults["aggregate_timeout_s"] = s.aggregate.timeout_s
        return p.options(**{**defaults, **options})

    def build_standalone(self, **options: Any) -> Pipeline:
        """Build with the recipe's own ``[standalone]`` tokenizer, seq_len and batch size."""
        st = self.spec.standalone
        if st is None:
            raise self._err("standalone", "this recipe has no [standalone] section (tokenizer, seq_len, batch_size)")
        tokenizer = None
        if not self.pretokenized:
            if not st.tokenizer:
                raise self._err("standalone.tokenizer", "text sources need a tokenizer file")
            tokenizer = load_tokenizer(self.resolve(st.tokenizer), f"{self.path}: standalone.tokenizer")
        return self.build(seq_len=st.seq_len, batch_size=st.batch_size, tokenizer=tokenizer, bos_id=st.bos_id, eos_id=st.eos_id, **options)


def _check_stage_layout(path: str, raw: dict[str, Any]) -> None:
    """With ``[[stages]]`` the weights live in the stages: a source's own ``weight`` would be silently unused."""
    if "stages" in raw and not isinstance(raw["stages"], list):
        raise ConfigError(f"{path}: stages: must be an array of tables, written [[stages]], got a {type(raw['stages']).__name__}")
    if not raw.get("stages"):
        return
    for n, src in enumerate(raw.get("sources") or []):
        if isinstance(src, dict) and "weight" in src:
            raise ConfigError(f"{path}: sources[{n}].weight: with [[stages]], weights are given per stage (stages[i].weights); remove it")


def _controller_keys(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with the keys of its ``[mixing]`` table that are not the common ones moved into ``controller_keys``:
    the chosen controller declares and checks them (``Recipe.mixing``), the schema cannot."""
    table = raw.get("mixing")
    if not isinstance(table, dict):
        return raw
    common = {f.name for f in fields(MixingSpec)} - {"controller_keys"}
    own = {k: v for k, v in table.items() if k not in common}
    return {**raw, "mixing": {**{k: v for k, v in table.items() if k in common}, "controller_keys": own}}


def load_recipe(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> Recipe:
    """Read and validate a TOML recipe (``overrides`` are merged over the file)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = str(path)
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read recipe ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML ({e})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 TOML file") from None
    if "sources" in raw and not isinstance(raw["sources"], list):
        raise ConfigError(f"{path}: sources: must be an array of tables, written [[sources]], got a {type(raw['sources']).__name__}")
    def fail(e: OmegaConfBaseException, prefix: str = "") -> ConfigError:
        key = prefix + (getattr(e, "full_key", None) or "")
        return ConfigError(f"{path}: {key + ': ' if key else ''}{str(e).splitlines()[0]}")

    # Each source and stage first on its own: OmegaConf's messages lose list indices.
    for key, table in (("sources", SourceSpec), ("stages", StageSpec)):
        for n, entry in enumerate(raw.get(key, []) if isinstance(raw.get(key), list) else []):
            try:
                OmegaConf.merge(OmegaConf.structured(table), OmegaConf.create(entry))
            except OmegaConfBaseException as e:
                raise fail(e, f"{key}[{n}].") from None
    _check_stage_layout(path, raw)
    raw, overrides = _controller_keys(raw), _controller_keys(overrides or {})
    try:
        schema = OmegaConf.structured(RecipeSpec)
        merged = OmegaConf.merge(schema, OmegaConf.create(raw), OmegaConf.create(overrides or {}))
        spec = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise fail(e) from None
    except (TypeError, ValueError) as e:  # OmegaConf raises these for container mismatches
        raise ConfigError(f"{path}: {e}") from None
    assert isinstance(spec, RecipeSpec)
    return Recipe(spec, path, Path(path).resolve().parent)
