"""The ledger of a run: which documents every global step trained on, and which steps trained on a document.

Two ways to build it from a checkpoint state, with the same rows (a property test holds them equal):

* from the run's batch audit logs, when their lines carry the batches' rows (``ledger_logs.ledger_from_logs``):
  no pipeline, no corpus read, no tokenizer; the state says which batches the ledger must hold;
* by replay (``build_ledger``): every lane's batches up to the state's ``delivered`` count are cut again on one
  process, over the recipe's mixture with the state's mixing journal replayed (a steered run's decided stages)
  and its surgery journal applied as the run applied it (skipped steps left out, quarantined documents left out
  from where they were); this reads and tokenizes the corpus again.

Lane ``l``'s batch ``i`` is the same on every topology, so it is global step ``i // (batches_per_step / C) + 1``.
Each row of the ledger is one stretch of a packed row: ``step, lane, lane_index, rank, row, source, document,
start, stop``, ordered by step, lane and batch; ``rank`` is the data-parallel group that trained the batch on
``dp_degree`` groups. A document's content hash (the first 16 hex digits of a SHA-256 of the document as its
source reads it: raw, never tokenized) is read only when asked for (a step's rows, a hash query, the Parquet
export), and only for the documents asked about. The batches' digests are kept beside it, to be compared with
the batch audit logs (``integration.batch_log``), which say what the ranks really trained on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon_core.checkpoint.state import parse_lanes, verify_checksum
from zephon_core.checkpoint.surgery import LaneSkips, surgery_journal_of
from zephon_core.errors import ConfigError, DataError
from zephon_core.integration.batch_log import LoggedBatch
from zephon_core.pipeline import Pipeline
from zephon_core.pipeline.mixing import with_history
from zephon_core.sources.base import Source

COLUMNS = ("step", "lane", "lane_index", "rank", "row", "source", "document", "start", "stop")


@dataclass
class Ledger:
    """The run's rows as NumPy columns (``COLUMNS``; ``source`` is a source number into ``sources``), each batch's
    digest (``digests[(lane, index)]``), how it was built (``built``: ``"logs"`` or ``"replay"``) and, from logs,
    the logged batches it left out (``extras``: trained after the state was taken, or in a skipped step).
    ``readers`` (the run's sources) read a document's content hash when one is asked for."""

    columns: dict[str, np.ndarray]
    sources: list[str]
    digests: dict[tuple[int, int], str]
    readers: Sequence[Source]
    built: str = "replay"
    extras: list[str] = field(default_factory=list)
    _hashes: dict[tuple[int, int], str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.columns["step"])

    def documents(self) -> np.ndarray:
        """The ``(source, document)`` pairs the run trained on, as a sorted ``[n, 2]`` array (no hash read)."""
        keys = np.unique(self._keys())
        return np.stack([keys >> 40, keys & ((1 << 40) - 1)], axis=1)

    def _keys(self) -> np.ndarray:
        return self.columns["source"] * (1 << 40) + self.columns["document"]

    def hash_of(self, source: int, document: int) -> str:
        """The content hash of one document (read from its source once, then kept)."""
        return self._hashed([(source, document)])[(source, document)]

    @property
    def hashes(self) -> dict[tuple[int, int], str]:
        """The content hash of every document of the run (reads each of them once)."""
        return self._hashed([(int(s), int(d)) for s, d in self.documents().tolist()])

    def _hashed(self, keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], str]:
        """``keys``' hashes added to those known, reading the documents not yet hashed (one read a source)."""
        wanted = sorted(set(keys) - self._hashes.keys())
        if not wanted:
            return self._hashes
        for s, src in enumerate(self.readers):
            docs = [d for t, d in wanted if t == s]
            for d, doc in zip(docs, src.read(docs) if docs else []):
                self._hashes[(s, d)] = content_hash(doc)
        return self._hashes

    def steps_of(self, source: int, document: int) -> list[int]:
        """Every global step that trained on a token of ``document`` of ``source``, in order."""
        c = self.columns
        hit = (c["source"] == source) & (c["document"] == document)
        return np.unique(c["step"][hit]).tolist()

    def rows_of(self, step: int) -> list[tuple[Any, ...]]:
        """Step ``step``'s rows as ``(lane, lane_index, rank, row, source name, document, start, stop, hash)``."""
        c = self.columns
        at = np.flatnonzero(c["step"] == step).tolist()
        hashes = self._hashed((int(c["source"][i]), int(c["document"][i])) for i in at)
        out = []
        for i in at:
            s, d = int(c["source"][i]), int(c["document"][i])
            out.append((*(int(c[k][i]) for k in COLUMNS[1:5]), self.sources[s], d, int(c["start"][i]),
                        int(c["stop"][i]), hashes[(s, d)]))
        return out

    def documents_of(self, name: str) -> list[tuple[int, int]]:
        """``SOURCE#N`` (a source's name and a document number) or a content hash as ``(source, document)`` pairs:
        one for ``SOURCE#N``, every document of the run with that content for a hash (which reads them all)."""
        source, sep, number = name.rpartition("#")
        if sep and source in self.sources and number.isdigit():
            return [(self.sources.index(source), int(number))]
        found = sorted(key for key, h in self.hashes.items() if h == name)
        if not found:
            raise ConfigError(f"{name!r} is neither SOURCE#N (sources: {', '.join(self.sources)}) nor the content hash "
                              "of a document this run trained on")
        return found

    def check_logs(self, logged: Iterable[tuple[str, LoggedBatch]]) -> list[str]:
        """Problems between the ledger and the batch audit logs' ``(file, line)`` pairs (none: they agree on the
        digest, and on the rows where the line says them, of every batch both have, and every batch of the ledger
        was logged)."""
        seen, problems = set(), []
        spans = self._spans()
        for where, b in logged:
            key = (b.lane, b.lane_index)
            ours = self.digests.get(key)
            seen.add(key)
            if ours is not None and ours != b.digest:
                problems.append(f"lane {b.lane} batch {b.lane_index} ({where}): the log has digest {b.digest}, "
                                f"the ledger {ours}")
            elif ours is not None and b.rows and not np.array_equal(b.stretches(), self._segments(spans.get(key))):
                problems.append(f"lane {b.lane} batch {b.lane_index} ({where}): the log's rows are not the ledger's")
        missing = sorted(set(self.digests) - seen)
        if missing:
            problems.append(f"{len(missing)} batch(es) of the ledger are in no log, first lane {missing[0][0]} "
                            f"batch {missing[0][1]}")
        return problems

    def _spans(self) -> dict[tuple[int, int], tuple[int, int]]:
        """Where each batch's rows lie in the columns (they are contiguous: ordered by step, lane, batch)."""
        c = self.columns
        keys = c["lane"] * (1 << 40) + c["lane_index"]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.zeros(0, dtype=np.int64)
        stops = np.r_[starts[1:], len(keys)]
        return {(int(c["lane"][a]), int(c["lane_index"][a])): (int(a), int(b))
                for a, b in zip(starts.tolist(), stops.tolist())}

    def _segments(self, span: tuple[int, int] | None) -> np.ndarray:
        a, b = span or (0, 0)
        return np.stack([self.columns[k][a:b] for k in COLUMNS[4:]], axis=1)

    def write_parquet(self, path: str) -> None:
        """The rows as one Parquet table (``source`` as its name, ``hash`` beside each row: reads every document)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        c = self.columns
        uniq, inverse = np.unique(self._keys(), return_inverse=True)
        pairs = [(k >> 40, k & ((1 << 40) - 1)) for k in uniq.tolist()]
        known = self._hashed(pairs)
        hashes = pa.array([known[key] for key in pairs])
        table = pa.table({
            **{k: pa.array(c[k]) for k in COLUMNS if k != "source"},
            "source": pa.DictionaryArray.from_arrays(pa.array(c["source"].astype(np.int32)), pa.array(self.sources)),
            "hash": pa.DictionaryArray.from_arrays(pa.array(inverse.astype(np.int32)), hashes),
        })
        pq.write_table(table, path)


def content_hash(document: Any) -> str:
    """The content hash of a document as its source reads it (text, tokens or a record)."""
    if isinstance(document, str):
        data = document.encode()
    elif isinstance(document, bytes):
        data = document
    elif isinstance(document, Mapping):
        data = json.dumps(document, sort_keys=True, default=str).encode()
    else:
        data = np.asarray(document, dtype=np.int64).tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


@dataclass(frozen=True)
class Plan:
    """What a state says the ledger holds: lane ``l``'s batches ``0 .. wanted[l] - 1`` less ``skips``; a batch's
    step is ``index // per_step + 1``, its rank ``lane // lanes_per_rank``."""

    wanted: dict[int, int]
    skips: LaneSkips | None
    per_step: int
    lanes_per_rank: int

    def owes(self, lane: int, index: int) -> bool:
        return index < self.wanted.get(lane, 0) and not (self.skips is not None and index in self.skips)

    def owed(self) -> int:
        return sum(n - sum(1 for i in range(n) if self.skips is not None and i in self.skips)
                   for n in self.wanted.values())

    def head(self, lane: int, index: int) -> tuple[int, int, int, int]:
        """A batch's ``step, lane, lane_index, rank``."""
        return index // self.per_step + 1, lane, index, lane // self.lanes_per_rank


def plan_of(state: Mapping[str, Any], batches_per_step: int, dp_degree: int | None = None) -> Plan:
    """The ledger's plan from a checked state (``dp_degree``: the run's, for the rank column; default the state's)."""
    lanes = parse_lanes(state)
    verify_checksum(state)
    C = state["canonical_replicas"]
    if batches_per_step % C:
        raise ConfigError(f"batches per step {batches_per_step} must be a multiple of canonical_replicas {C}")
    G = dp_degree or state["topology"].get("dp_degree") or 1
    return Plan({lane: ls.delivered for lane, ls in lanes.items()}, surgery_journal_of(state).skipper(),
                batches_per_step // C, C // G)


def ledger_of(table: np.ndarray, sources: Sequence[Source], digests: dict[tuple[int, int], str],
              built: str, extras: list[str] | None = None) -> Ledger:
    """The ledger of ``table``'s rows (``[n, 9]``, any batch order; a batch's stretches in their order)."""
    table = table.reshape(-1, len(COLUMNS))
    table = table[np.lexsort((table[:, 2], table[:, 1], table[:, 0]))]  # stable: a batch's stretches keep order
    columns = {name: np.ascontiguousarray(table[:, n]) for n, name in enumerate(COLUMNS)}
    return Ledger(columns, [s.name for s in sources], digests, sources, built, extras or [])


def build_ledger(make: Callable[[], Pipeline], state: Mapping[str, Any], batches_per_step: int,
                 dp_degree: int | None = None, where: str = "") -> Ledger:
    """The ledger of the run ``state`` is a checkpoint of, by replay; ``make()`` builds its recipe's pipeline on one
    group, all lanes; the state's history is applied to it here (``with_history``: a steered run's journal replayed,
    its skips and quarantines as its lanes applied them; what does not fit is refused, starting with ``where``)."""
    plan = plan_of(state, batches_per_step, dp_degree)
    owed = plan.owed()
    pipeline = with_history(make(), state, where=where)
    parts: list[np.ndarray] = []
    digests: dict[tuple[int, int], str] = {}
    with pipeline:
        it = iter(pipeline)
        while len(digests) < owed:
            b = next(it, None)
            if b is None:
                raise DataError(f"the data ended after {len(digests)} of the state's {owed} batches: "
                                "the recipe is not the one the state was taken with")
            if b.lane_index >= plan.wanted.get(b.lane, 0):
                continue
            digests[(b.lane, b.lane_index)] = b.digest
            seg = b.segments
            head = np.array(plan.head(b.lane, b.lane_index), dtype=np.int64)
            parts.append(np.hstack([np.broadcast_to(head, (len(seg), 4)), seg]))
    table = np.vstack(parts) if parts else np.zeros((0, len(COLUMNS)), dtype=np.int64)
    return ledger_of(table, pipeline.work_source.sources, digests, "replay")
