"""The ledger of a run: which documents every global step trained on, and which steps trained on a document.

Built from a checkpoint state: every lane's batches up to the state's ``delivered`` count are cut again on
one process (lane ``l``'s batch ``i`` is the same on every topology, so it is global step
``i // (batches_per_step / C) + 1``), with the state's surgery journal applied as the run applied it (skipped
steps left out, quarantined documents left out from where they were). Each row of the
ledger is one stretch of a packed row: ``step, lane, lane_index, rank, row, source, document, start, stop,
hash``; ``rank`` is the data-parallel group that trained the batch on ``dp_degree`` groups, ``hash`` the
document's content hash (the first 16 hex digits of a SHA-256 of the document as its source reads it).
The batches' digests are kept beside it, to be compared with the batch audit logs
(``integration.batch_log``), which say what the ranks really trained on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_core.checkpoint.state import parse_lanes, verify_checksum
from zephon_core.checkpoint.surgery import journal_of
from zephon_core.errors import ConfigError, DataError
from zephon_core.pipeline import Pipeline

COLUMNS = ("step", "lane", "lane_index", "rank", "row", "source", "document", "start", "stop")


@dataclass
class Ledger:
    """The run's rows as NumPy columns (``COLUMNS``; ``source`` is a source number into ``sources``), the content
    hash of each document (``hashes[(source, document)]``) and each batch's digest (``digests[(lane, index)]``)."""

    columns: dict[str, np.ndarray]
    sources: list[str]
    hashes: dict[tuple[int, int], str]
    digests: dict[tuple[int, int], str]

    def __len__(self) -> int:
        return len(self.columns["step"])

    def steps_of(self, source: int, document: int) -> list[int]:
        """Every global step that trained on a token of ``document`` of ``source``, in order."""
        c = self.columns
        hit = (c["source"] == source) & (c["document"] == document)
        return np.unique(c["step"][hit]).tolist()

    def rows_of(self, step: int) -> list[tuple[Any, ...]]:
        """Step ``step``'s rows as ``(lane, lane_index, rank, row, source name, document, start, stop, hash)``."""
        c = self.columns
        at = np.flatnonzero(c["step"] == step)
        out = []
        for i in at.tolist():
            s, d = int(c["source"][i]), int(c["document"][i])
            out.append((*(int(c[k][i]) for k in COLUMNS[1:5]), self.sources[s], d, int(c["start"][i]),
                        int(c["stop"][i]), self.hashes[(s, d)]))
        return out

    def documents_of(self, name: str) -> list[tuple[int, int]]:
        """``SOURCE#N`` (a source's name and a document number) or a content hash as ``(source, document)`` pairs:
        one for ``SOURCE#N``, every document of the run with that content for a hash."""
        source, sep, number = name.rpartition("#")
        if sep and source in self.sources and number.isdigit():
            return [(self.sources.index(source), int(number))]
        found = sorted(key for key, h in self.hashes.items() if h == name)
        if not found:
            raise ConfigError(f"{name!r} is neither SOURCE#N (sources: {', '.join(self.sources)}) nor the content hash "
                              "of a document this run trained on")
        return found

    def check_logs(self, logged: Iterable[tuple[int, int, str]]) -> list[str]:
        """Problems between the ledger and the batch audit logs' ``(lane, lane_index, digest)`` lines (none: they
        agree on every batch both have, and every batch of the ledger was logged)."""
        seen, problems = set(), []
        for lane, index, digest in logged:
            ours = self.digests.get((lane, index))
            seen.add((lane, index))
            if ours is not None and ours != digest:
                problems.append(f"lane {lane} batch {index}: the log has digest {digest}, the ledger {ours}")
        missing = sorted(set(self.digests) - seen)
        if missing:
            problems.append(f"{len(missing)} batch(es) of the ledger are in no log, first lane {missing[0][0]} "
                            f"batch {missing[0][1]}")
        return problems

    def write_parquet(self, path: str) -> None:
        """The rows as one Parquet table (``source`` as its name, ``hash`` beside each row)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        c = self.columns
        keys = c["source"] * (1 << 40) + c["document"]
        uniq, inverse = np.unique(keys, return_inverse=True)
        hashes = pa.array([self.hashes[(int(k >> 40), int(k & ((1 << 40) - 1)))] for k in uniq.tolist()])
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


def build_ledger(make: Callable[[], Pipeline], state: Mapping[str, Any], batches_per_step: int,
                 dp_degree: int | None = None) -> Ledger:
    """The ledger of the run ``state`` is a checkpoint of; ``make()`` builds its pipeline on one group, all lanes."""
    lanes = parse_lanes(state)
    verify_checksum(state)
    C = state["canonical_replicas"]
    if batches_per_step % C:
        raise ConfigError(f"batches per step {batches_per_step} must be a multiple of canonical_replicas {C}")
    k = batches_per_step // C
    G = dp_degree or state["topology"].get("dp_degree") or 1
    skips = journal_of(state).skipper()
    wanted = {lane: ls.delivered for lane, ls in lanes.items()}
    owed = sum(n - sum(1 for i in range(n) if skips is not None and i in skips) for n in wanted.values())
    pipeline = make()
    pipeline.surgery = journal_of(state)  # the run's skips and quarantines, as its lanes applied them
    parts: list[np.ndarray] = []
    digests: dict[tuple[int, int], str] = {}
    with pipeline:
        it = iter(pipeline)
        while len(digests) < owed:
            b = next(it, None)
            if b is None:
                raise DataError(f"the data ended after {len(digests)} of the state's {owed} batches: "
                                "the recipe is not the one the state was taken with")
            if b.lane_index >= wanted.get(b.lane, 0):
                continue
            digests[(b.lane, b.lane_index)] = b.digest
            seg = b.segments
            head = np.array([b.lane_index // k + 1, b.lane, b.lane_index, b.lane // (C // G)], dtype=np.int64)
            parts.append(np.hstack([np.broadcast_to(head, (len(seg), 4)), seg]))
    table = np.vstack(parts) if parts else np.zeros((0, len(COLUMNS)), dtype=np.int64)
    columns = {name: np.ascontiguousarray(table[:, n]) for n, name in enumerate(COLUMNS)}
    return Ledger(columns, [s.name for s in pipeline.work_source.sources],
                  _hashes(pipeline, columns["source"], columns["document"]), digests)


def _hashes(pipeline: Pipeline, sources: np.ndarray, documents: np.ndarray) -> dict[tuple[int, int], str]:
    """The content hash of every document the ledger names, read from its source (one read a source)."""
    out = {}
    for s, src in enumerate(pipeline.work_source.sources):
        docs = np.unique(documents[sources == s]).tolist()
        for d, doc in zip(docs, src.read(docs) if docs else []):
            out[(s, d)] = content_hash(doc)
    return out
