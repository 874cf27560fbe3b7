"""A state's data definition, read once, strictly, into typed values.

``Pipeline.definition()`` (and so every checkpoint's ``definition``) is
``{"work_source": {...}, "ops": [...]}``. ``parse_definition`` reads it; a
mixture's work source (``static_mixture`` or ``staged_mixture``) becomes a
``Curriculum`` in which a static mixture reads as one document-weighted stage
from chunk 0 (the same chunks: ``mixture_base``), and every operator a
``dict`` found by its ``op``; a steered mixture's ``journal`` (``curriculum.journal``)
is read too. Malformed input raises a one-line ``StateError``
naming the field (``definition.work_source.stages[1].weights``); a work source
of another kind parses to None. Nothing here reads data or builds a curriculum,
except ``StageEntry.stage()``, the ``Stage`` a stage was given as.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

from zephon_core.curriculum.journal import MixingJournal, parse_journal
from zephon_core.curriculum.mixture_base import EXHAUSTION_POLICIES, largest_remainder
from zephon_core.curriculum.stages import WEIGHT_BY, Stage
from zephon_core.errors import StateError

MIXTURES = ("static_mixture", "staged_mixture")
_COMMON = {"kind", "seed", "chunk_size", "exhausted", "shuffle", "sources"}
_KEYS = {"static_mixture": (_COMMON, {"order"}),
         "staged_mixture": (_COMMON | {"stages"}, {"order", "token_estimates", "journal"})}
_STAGE = {"name", "start_chunk", "start", "weight_by", "weights", "per_chunk"}
_STARTS = ({"chunk"}, {"tokens"}, {"step", "tokens_per_step"})
_DATA = ("start_chunk", "weight_by", "weights", "per_chunk")  # what a static mixture's one stage is compared on


def _fail(where: str, what: str, value: Any) -> StateError:
    return StateError(f"state field {where}: {what}, got {type(value).__name__} {value!r}"[:300])


def _map(value: Any, where: str, need: set[str] | None = None, may: Set[str] = frozenset()) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, "must be a dict", value)
    if need is not None:
        missing, extra = sorted(need - value.keys()), sorted(set(value) - need - may)
        if missing or extra:
            problems = ([f"missing {', '.join(missing)}"] if missing else []) + (
                [f"unknown {', '.join(map(str, extra))}"] if extra else [])
            raise StateError(f"state field {where}: " + "; ".join(problems))
    return value


def _int(value: Any, where: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        raise _fail(where, "must be an integer" + (f" >= {minimum}" if minimum is not None else ""), value)
    return value


def _number(value: Any, where: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise _fail(where, "must be a finite number >= 0", value)
    return value


@dataclass(frozen=True)
class SourceEntry:
    """One source as a definition records it: its name, its fingerprint, its weight (static mixtures only)."""

    name: str
    fingerprint: dict[str, Any]
    weight: int | float | None = None

    @property
    def documents(self) -> int | None:
        """Its documents, where its fingerprint counts them."""
        n = self.fingerprint.get("documents")
        return n if isinstance(n, int) and not isinstance(n, bool) else None

    def definition(self, weight: bool = True) -> dict[str, Any]:
        """The entry as the definition records it (``weight=False``: as a staged mixture does)."""
        w = {"weight": self.weight} if weight and self.weight is not None else {}
        return {"name": self.name, **w, **self.fingerprint}


@dataclass(frozen=True)
class StageEntry:
    """One stage: where it starts (``start_chunk``; ``start`` as given: chunk, tokens or step), weights, shares."""

    name: str | None
    start_chunk: int
    start: dict[str, int]
    weight_by: str
    weights: dict[str, int | float]
    per_chunk: dict[str, int]

    def data(self) -> dict[str, Any]:
        """What decides the stage's chunks (a static mixture's one stage has nothing else)."""
        return {k: getattr(self, k) for k in _DATA}

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "start": dict(self.start), **self.data()}

    @property
    def tokens_per_step(self) -> int | None:
        return self.start.get("tokens_per_step")

    def stage(self, first: bool = False) -> Stage:
        """The ``Stage`` this one was given as (``first``: it starts the run and takes no start)."""
        given = {} if first else {f"start_{unit}": self.start.get(unit) for unit in ("chunk", "tokens", "step")}
        return Stage(dict(self.weights), self.name, weight_by=self.weight_by, **given)


@dataclass(frozen=True)
class Curriculum:
    """A mixture's definition, typed; a static mixture is one stage named None, from chunk 0, by documents."""

    kind: str
    seed: int
    chunk_size: int
    exhausted: str
    shuffle: Any
    sources: tuple[SourceEntry, ...]
    stages: tuple[StageEntry, ...]
    order: dict[str, Any] | None = None
    token_estimates: dict[str, Any] | None = None
    journal: MixingJournal | None = None  # a steered mixture's decisions (its stages from ``mix0`` on)

    @property
    def static(self) -> bool:
        return self.kind == "static_mixture"

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

    @property
    def sizes(self) -> list[int | None]:
        return [s.documents for s in self.sources]

    @property
    def stage_starts(self) -> list[int]:
        return [st.start_chunk for st in self.stages]

    def stage_shares(self) -> list[tuple[str, list[float]]]:
        """Per stage, ``(weight_by, share of each source)`` as ``WorkSource.stage_shares`` gives it."""
        out = []
        for st in self.stages:
            values = [float(w) for w in self.weights_of(st)]
            total = math.fsum(values)
            out.append((st.weight_by, [v / total if total else 0.0 for v in values]))
        return out

    def weights_of(self, stage: StageEntry) -> list[int | float]:
        """The stage's weight of every source, in the sources' order (0: not read; a static mixture's own weights)."""
        if self.static:
            return [s.weight or 0 for s in self.sources]
        return [stage.weights.get(n, 0) for n in self.names]

    def staged_form(self) -> dict[str, Any] | None:
        """The definition in the staged form (a static mixture's sources without weights, its one stage's data,
        ``static``: True), as ``checkpoint.compat`` compares curricula; None for a static mixture whose sources
        share a name (stages refer to sources by name)."""
        if self.static and len(set(self.names)) != len(self.names):
            return None
        out: dict[str, Any] = {"kind": "staged_mixture", "seed": self.seed, "chunk_size": self.chunk_size,
                               "exhausted": self.exhausted, "shuffle": self.shuffle,
                               "sources": [s.definition(weight=False) for s in self.sources]}
        if self.static:
            return {**out, "order": self.order, "stages": [self.stages[0].data()], "static": True}
        out["stages"] = [st.definition() for st in self.stages]
        for key in ("order", "token_estimates"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass(frozen=True)
class Definition:
    """A whole data definition: the curriculum (None: a work source that is not a mixture) and the operators."""

    work_source: Curriculum | None
    ops: tuple[dict[str, Any], ...]

    def op(self, kind: str) -> dict[str, Any] | None:
        """The operator of that kind (``"pack"``, ``"batch"``, ...), if the pipeline has one."""
        return next((op for op in self.ops if op["op"] == kind), None)

    @property
    def seq_len(self) -> int | None:
        pack = self.op("pack")
        return pack.get("seq_len") if pack else None

    @property
    def batch_size(self) -> int | None:
        batch = self.op("batch")
        return batch.get("batch_size") if batch else None

    @property
    def journal(self) -> MixingJournal | None:
        """A steered mixture's journal of decisions (None: the mixture is the recipe's alone)."""
        return self.work_source.journal if self.work_source is not None else None

    def row_shape(self) -> tuple[int, int] | None:
        """Rows per batch and tokens per row (``seq_len + 1``); None without both ``pack`` and ``batch``."""
        if self.seq_len is None or self.batch_size is None:
            return None
        return int(self.batch_size), int(self.seq_len) + 1


def parse_definition(definition: Any, where: str = "definition") -> Definition:
    """A state's ``definition``, checked and typed; a malformed one raises ``StateError`` naming the field."""
    d = _map(definition, where, {"work_source", "ops"})
    ops = d["ops"]
    if not isinstance(ops, list):
        raise _fail(f"{where}.ops", "must be a list of operators", ops)
    for i, op in enumerate(ops):
        if not isinstance(_map(op, f"{where}.ops[{i}]").get("op"), str):
            raise _fail(f"{where}.ops[{i}].op", "must name the operator", op.get("op"))
    return Definition(parse_curriculum(d["work_source"], f"{where}.work_source"), tuple(dict(op) for op in ops))


def parse_curriculum(work_source: Any, where: str = "definition.work_source") -> Curriculum | None:
    """A work source's definition as a ``Curriculum``; None when it is not a mixture's."""
    kind = _map(work_source, where).get("kind")
    if kind not in MIXTURES:
        return None
    ws = _map(work_source, where, *_KEYS[kind])
    chunk_size = _int(ws["chunk_size"], f"{where}.chunk_size", 1)
    if ws["exhausted"] not in EXHAUSTION_POLICIES:
        raise _fail(f"{where}.exhausted", f"must be one of {', '.join(EXHAUSTION_POLICIES)}", ws["exhausted"])
    if not isinstance(ws["sources"], list) or not ws["sources"]:
        raise _fail(f"{where}.sources", "must be a non-empty list", ws["sources"])
    sources = tuple(_source(s, f"{where}.sources[{i}]", kind == "static_mixture") for i, s in enumerate(ws["sources"]))
    if kind == "static_mixture":
        counts = largest_remainder([s.weight or 0 for s in sources], chunk_size)
        weights = {s.name: s.weight or 0 for s in sources}
        stages: tuple[StageEntry, ...] = (StageEntry(None, 0, {"chunk": 0}, "documents", weights,
                                                     {s.name: c for s, c in zip(sources, counts)}),)
    elif not isinstance(ws["stages"], list) or not ws["stages"]:
        raise _fail(f"{where}.stages", "must be a non-empty list", ws["stages"])
    else:
        stages = tuple(_stage(st, f"{where}.stages[{i}]") for i, st in enumerate(ws["stages"]))
    order, estimates = ws.get("order"), ws.get("token_estimates")
    seed = _int(ws["seed"], f"{where}.seed")
    journal = parse_journal(ws["journal"], f"{where}.journal") if "journal" in ws else None
    return Curriculum(kind, seed, chunk_size, ws["exhausted"], ws["shuffle"], sources, stages,
                      None if order is None else dict(_map(order, f"{where}.order")),
                      None if estimates is None else dict(_map(estimates, f"{where}.token_estimates")), journal)


def _source(value: Any, where: str, weighted: bool) -> SourceEntry:
    s = _map(value, where)
    if not isinstance(s.get("name"), str):
        raise _fail(f"{where}.name", "must be a string", s.get("name"))
    if weighted and (s.get("weight") is None or not _number(s["weight"], f"{where}.weight")):
        raise _fail(f"{where}.weight", "must be a number > 0", s.get("weight"))
    return SourceEntry(s["name"], {k: v for k, v in s.items() if k not in ("name", "weight")},
                       s["weight"] if weighted else None)


def _stage(value: Any, where: str) -> StageEntry:
    st = _map(value, where, _STAGE)
    if not isinstance(st["name"], str):
        raise _fail(f"{where}.name", "must be a string", st["name"])
    start = _map(st["start"], f"{where}.start")
    if set(start) not in _STARTS:
        raise _fail(f"{where}.start", "must be {chunk}, {tokens} or {step, tokens_per_step}", dict(start))
    if st["weight_by"] not in WEIGHT_BY:
        raise _fail(f"{where}.weight_by", f"must be one of {', '.join(WEIGHT_BY)}", st["weight_by"])
    given = _map(st["weights"], f"{where}.weights")
    weights = {str(k): _number(w, f"{where}.weights.{k}") for k, w in given.items()}
    counts = _map(st["per_chunk"], f"{where}.per_chunk")
    per_chunk = {str(k): _int(c, f"{where}.per_chunk.{k}", 0) for k, c in counts.items()}
    starts = {k: _int(v, f"{where}.start.{k}", 0) for k, v in start.items()}
    first = _int(st["start_chunk"], f"{where}.start_chunk", 0)
    return StageEntry(st["name"], first, starts, st["weight_by"], weights, per_chunk)
