"""Reading a range of one chunk's documents and turning them into token ids.

A *piece* is documents ``[lo, hi)`` of a chunk, read and run through the
per-document operators, held as one flat token array with offsets. Lanes
usually read whole chunks as one piece; the first chunk a lane reads after a
(re)start is read in slices of ``SLICE_DOCS`` documents, so the first batch
waits only for the documents it needs rather than for the whole chunk.
Without per-document operators, a lane's first chunk is one piece, and later
pieces from pretokenized sources (``read_flat``) span several whole chunks
(see ``zephon_core.lane.reader.PIECE_DOCS``): reading them is cheap, and rows are cut per piece.

Filtered-out documents keep their slot as empty documents, so document
numbers in cursors do not depend on the filter's output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_core.arrays import distinct, gather_index, read_flat_grouped
from zephon_core.curriculum.work_source import Chunk, WorkSource
from zephon_core.errors import DataError
from zephon_core.lane.chunks import LaneQuarantine
from zephon_core.lane.docops import DROPPED, DocOpRunner
from zephon_core.metrics import COUNTERS

# Documents per slice of a lane's first chunk: a batch needs only as many slices as it has documents.
SLICE_DOCS = 8


@dataclass
class Piece:
    """Consecutive documents of a lane, as token ids: document ``j`` is ``tokens[offsets[j]:offsets[j + 1]]``.

    ``chunk[j]`` and ``index[j]`` place document ``j`` in the lane (lane chunk
    number, document number within that chunk); ``sources[j]`` and
    ``documents[j]`` name it in the work source. The first ``headroom`` tokens
    are free room in front of the first document, where a packer may put the
    row it carries over from the last piece.
    """

    chunk: np.ndarray
    index: np.ndarray
    sources: np.ndarray
    documents: np.ndarray
    tokens: np.ndarray  # int64: the headroom, then the documents end to end
    offsets: np.ndarray  # int64, one more entry than documents, from ``headroom``
    headroom: int = 0


def slice_bounds(chunk_len: int, first_doc: int, i: int) -> tuple[int, int]:
    """The slice holding document ``i`` of a lane's first chunk, read from ``first_doc`` on."""
    lo = first_doc + (i - first_doc) // SLICE_DOCS * SLICE_DOCS
    return lo, min(chunk_len, lo + SLICE_DOCS)


def _flat_from_sources(work_source: WorkSource, srcs: np.ndarray, docs: np.ndarray, headroom: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The documents straight from pretokenized sources, or None if a source has no ``read_flat``."""
    kinds = distinct(srcs)
    found = [getattr(work_source.sources[int(s)], "read_flat", None) for s in kinds]
    readers = [r for r in found if callable(r)]
    if len(readers) < len(found):
        return None
    by_source = dict(zip(kinds.tolist(), readers))
    with COUNTERS.timed("read_s"):
        tokens, lengths = read_flat_grouped(srcs, lambda s, where, room: by_source[s](docs[where], room), headroom)
    return tokens, _offsets(lengths, headroom)


def _offsets(lengths: np.ndarray, headroom: int) -> np.ndarray:
    offsets = np.empty(len(lengths) + 1, dtype=np.int64)
    offsets[0] = headroom
    np.cumsum(lengths, out=offsets[1:])
    offsets[1:] += headroom
    return offsets


def _emptied(flat: tuple[np.ndarray, np.ndarray], drop: np.ndarray, headroom: int) -> tuple[np.ndarray, np.ndarray]:
    """The flat tokens and offsets with the documents ``drop`` marks left empty (their slots kept)."""
    if not drop.any():
        return flat
    tokens, offsets = flat
    lengths = np.diff(offsets)
    keep = np.repeat(~drop, lengths)
    lengths[drop] = 0
    return np.concatenate([tokens[:headroom], tokens[headroom:][keep]]), _offsets(lengths, headroom)


def _flat_from_docs(work_source: WorkSource, srcs: np.ndarray, docnos: np.ndarray, runner: DocOpRunner,
                    headroom: int) -> tuple[np.ndarray, np.ndarray]:
    docs: list[Any] = [None] * len(srcs)
    with COUNTERS.timed("read_s"):
        for s in distinct(srcs):
            where = np.flatnonzero(srcs == s)
            for w, d in zip(where, work_source.sources[int(s)].read(docnos[where].tolist())):
                docs[int(w)] = d
    with COUNTERS.timed("tokenize_s"):
        docs = runner.run(docs)
    lengths = np.zeros(len(docs), dtype=np.int64)
    arrays = []
    for j, d in enumerate(docs):
        if d is DROPPED:
            continue
        if isinstance(d, (list, tuple)):
            d = np.asarray(d, dtype=np.int64)
        if not (isinstance(d, np.ndarray) and d.ndim == 1 and np.issubdtype(d.dtype, np.integer)):
            src = work_source.sources[int(srcs[j])]
            raise DataError(
                f"pack: document {int(docnos[j])} of source {src.name!r} is a {type(d).__name__}, "
                "not token ids; add .tokenize(...) before .pack(...)"
            )
        lengths[j] = len(d)
        arrays.append(d)
    tokens = np.empty(headroom + int(lengths.sum()), dtype=np.int64)
    if arrays:
        np.concatenate(arrays, out=tokens[headroom:], casting="unsafe")
    return tokens, _offsets(lengths, headroom)


def load_piece(work_source: WorkSource, runner: DocOpRunner, parts: list[tuple[int, Chunk, int, int]],
               headroom: int = 0, quarantine: LaneQuarantine | None = None) -> Piece:
    """Read documents ``lo..hi-1`` of each ``(lane chunk, chunk, lo, hi)`` and run the per-document operators on them,
    with ``headroom`` free tokens in front (see ``Piece``); ``quarantine``'s documents are left empty."""
    counts = np.array([hi - lo for _, _, lo, hi in parts], dtype=np.int64)
    chunk = np.repeat(np.array([k for k, _, _, _ in parts], dtype=np.int64), counts)
    index = gather_index(np.array([lo for _, _, lo, _ in parts], dtype=np.int64), counts)
    srcs = np.concatenate([c.sources[lo:hi] for _, c, lo, hi in parts])
    docs = np.concatenate([c.documents[lo:hi] for _, c, lo, hi in parts])
    flat = _flat_from_sources(work_source, srcs, docs, headroom) if not runner.ops else None
    if flat is None:
        flat = _flat_from_docs(work_source, srcs, docs, runner, headroom)
    if quarantine is not None:
        flat = _emptied(flat, quarantine.mask(chunk, srcs, docs), headroom)
    return Piece(chunk, index, srcs, docs, *flat, headroom=headroom)
