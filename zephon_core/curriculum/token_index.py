"""Tokens along a source's stream: how many precede a stream position, and which position a token count reaches.

Token-weighted stages (``weight_by="tokens"``) give each source a token quota
per chunk: chunk ``g`` takes the documents whose first token falls in its
quota. That needs, for any stream position ``p``, the tokens of the documents
at positions ``0 .. p-1`` (``cumstart``) and the inverse (``position_at``),
both as pure functions of ``p`` so that chunks stay seekable.

``TokenIndex`` answers both from the per-document token counts and the
source's order. Per epoch it keeps, for sources of up to ``FULL_PREFIX``
documents, the epoch's order itself (which then also gives the chunks their
documents) and the tokens before every stream position; above, the tokens
before every ``BLOCK``-th position (8 bytes per ``BLOCK`` documents; a query then evaluates the order
inside one block, and recently used blocks are kept). Building an epoch's
sums is one pass of the order over the source (``docs/performance.md``
measures it); it is done when a chunk first needs that epoch.

``measure_tokens`` gives the counts: exact where the source knows them
(pretokenized sources, ``Source.token_lengths``), else an estimate for text:
each document's stored bytes (``Source.byte_lengths``) times the tokens per
byte measured with the run's tokenizer on ``SAMPLE`` documents spread evenly
over the source; without stored sizes, every document counts as that
sample's mean. The estimate is deterministic and recorded in the data
definition.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_core.curriculum.order import SourceOrder
from zephon_core.errors import ConfigError
from zephon_core.sources.base import Source

FULL_PREFIX = 1 << 19  # up to this many documents an epoch keeps its order and the tokens before every position (16 bytes each)
BLOCK = 64  # above it, the tokens before every BLOCK-th position, and a query evaluates the order in one block
SAMPLE = 256
_PASS = 1 << 20  # stream positions mapped at once while building an epoch's sums
_EPOCHS_KEPT = 3
_BLOCKS_KEPT = 4096

TokenCounter = Callable[[Sequence[Any]], Sequence[int]]
"""Documents -> the number of tokens each becomes, as the pipeline delivers them (special tokens included)."""


@dataclass(frozen=True)
class DocumentTokens:
    """Tokens of every document of one source, exact or estimated, and how they were obtained."""

    lengths: np.ndarray  # int64, one per document
    method: dict[str, Any]  # for the data definition: {"method": "exact"} or the estimate's parameters

    @property
    def total(self) -> int:
        return int(self.lengths.sum())

    @property
    def mean(self) -> float:
        return self.total / len(self.lengths)

    @property
    def exact(self) -> bool:
        return self.method["method"] == "exact"


def measure_tokens(source: Source, counter: TokenCounter | None, where: str) -> DocumentTokens:
    """The token counts of ``source``'s documents: exact when it knows them, else estimated with ``counter``."""
    exact = source.token_lengths()
    if exact is not None:
        return DocumentTokens(np.asarray(exact, dtype=np.int64), {"method": "exact"})
    if counter is None:
        raise ConfigError(
            f"{where}: source {source.name!r} does not know its documents' token counts; counting tokens of text needs "
            "token_counter (a recipe passes the run's tokenizer; in Python use zephon_core.token_counter(tokenizer, eos_id=...))"
        )
    n = len(source)
    k = min(n, SAMPLE)
    picks = (np.arange(k, dtype=np.int64) * n) // k
    counts = np.asarray(list(counter(source.read(picks.tolist()))), dtype=np.int64)
    sizes = source.byte_lengths()
    if sizes is not None and int(np.asarray(sizes)[picks].sum()) > 0:
        sizes = np.asarray(sizes, dtype=np.int64)
        # Rounded to 6 significant digits: the definition records the very number the estimate uses.
        ratio = float(f"{counts.sum() / sizes[picks].sum():.6g}")
        lengths = np.rint(sizes * ratio).astype(np.int64)
        return DocumentTokens(lengths, {"method": "bytes", "tokens_per_byte": ratio, "sample": k})
    mean = max(1, round(float(counts.mean())))
    return DocumentTokens(np.full(n, mean, dtype=np.int64), {"method": "sample_mean", "tokens": mean, "sample": k})


class TokenIndex:
    """``cumstart`` and ``position_at`` over the endless stream of one source (epoch ``e`` = positions ``e*n .. e*n+n-1``)."""

    def __init__(self, tokens: DocumentTokens, order: SourceOrder, where: str) -> None:
        self.n = len(tokens.lengths)
        self.total = tokens.total
        if self.total <= 0:
            raise ConfigError(f"{where}: every document is empty, so it cannot take a share of tokens")
        self.block = 1 if self.n <= FULL_PREFIX else BLOCK
        self._lengths = tokens.lengths
        self._order = order
        self._epochs: OrderedDict[int, tuple[np.ndarray | None, np.ndarray]] = OrderedDict()
        self._blocks: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def _epoch(self, e: int) -> tuple[np.ndarray | None, np.ndarray]:
        """Epoch ``e``'s order (full mode; else None) and the tokens before each of its blocks (``nb + 1`` entries)."""
        with self._lock:
            if e in self._epochs:
                self._epochs.move_to_end(e)
                return self._epochs[e]
        n, B = self.n, self.block
        order = self._order.documents(np.arange(e * n, e * n + n, dtype=np.int64)) if B == 1 else None
        sums = []
        for a in range(0, n, _PASS):
            docs = order[a : a + _PASS] if order is not None else self._order.documents(np.arange(e * n + a, e * n + min(n, a + _PASS), dtype=np.int64))
            lens = self._lengths[docs]
            if B > 1:
                lens = np.concatenate([lens, np.zeros((-len(lens)) % B, np.int64)]).reshape(-1, B).sum(axis=1)
            sums.append(lens)
        prefix = np.zeros(sum(len(x) for x in sums) + 1, dtype=np.int64)
        np.cumsum(np.concatenate(sums), out=prefix[1:])
        with self._lock:
            self._epochs[e] = (order, prefix)
            if len(self._epochs) > _EPOCHS_KEPT:
                self._epochs.popitem(last=False)
        return order, prefix

    def documents(self, positions: np.ndarray) -> np.ndarray:
        """``order.documents(positions)``, from the kept epoch orders where there are some."""
        p = np.asarray(positions, dtype=np.int64)
        if self.block != 1 or not p.size:
            return self._order.documents(p)
        out = np.empty_like(p)
        epochs, r = np.divmod(p, self.n)
        for e in np.unique(epochs).tolist():
            sel = epochs == e
            order, _ = self._epoch(e)
            assert order is not None
            out[sel] = order[r[sel]]
        return out

    def _within(self, e: int, blocks: np.ndarray) -> np.ndarray:
        """Row ``j``: tokens before each of the ``BLOCK + 1`` positions of block ``blocks[j]`` of epoch ``e``, from the block's start."""
        with self._lock:
            rows = {b: self._blocks[(e, b)] for b in set(blocks.tolist()) if (e, b) in self._blocks}
        missing = sorted(set(blocks.tolist()) - set(rows))
        if missing:
            local = np.asarray(missing, dtype=np.int64)[:, None] * BLOCK + np.arange(BLOCK, dtype=np.int64)
            pos = e * self.n + np.minimum(local, self.n - 1)
            lens = np.where(local < self.n, self._lengths[self._order.documents(pos.ravel())].reshape(pos.shape), 0)
            fresh = np.zeros((len(missing), BLOCK + 1), dtype=np.int64)
            np.cumsum(lens, axis=1, out=fresh[:, 1:])
            with self._lock:
                for b, row in zip(missing, fresh):
                    rows[b] = self._blocks[(e, b)] = row
                while len(self._blocks) > _BLOCKS_KEPT:
                    self._blocks.popitem(last=False)
        return np.stack([rows[b] for b in blocks.tolist()])

    def cumstart(self, positions: np.ndarray) -> np.ndarray:
        """Tokens of the documents at stream positions ``0 .. p-1``, for each ``p``."""
        p = np.asarray(positions, dtype=np.int64)
        out = np.empty_like(p)
        epochs, r = np.divmod(p, self.n)
        for e in np.unique(epochs).tolist():
            sel = epochs == e
            prefix, rs = self._epoch(e)[1], r[sel]
            if self.block == 1:
                out[sel] = e * self.total + prefix[rs]
                continue
            b = rs // BLOCK
            out[sel] = e * self.total + prefix[b] + self._within(e, b)[np.arange(len(rs)), rs - b * BLOCK]
        return out

    def position_at(self, tokens: np.ndarray) -> np.ndarray:
        """The first stream position ``p`` with ``cumstart(p) >= x``, for each ``x >= 0``."""
        x = np.asarray(tokens, dtype=np.int64)
        out = np.zeros_like(x)
        live = np.flatnonzero(x > 0)
        # x in (e*total, (e+1)*total] is reached inside epoch e: trailing empty documents of an
        # epoch precede the next one's first position.
        epochs = (x[live] - 1) // self.total
        for e in np.unique(epochs).tolist():
            idx = live[epochs == e]
            prefix, r = self._epoch(e)[1], x[idx] - e * self.total
            if self.block == 1:
                out[idx] = e * self.n + np.searchsorted(prefix, r, side="left")
                continue
            b = np.searchsorted(prefix, r, side="left") - 1
            within = self._within(e, b)
            j = (within < (r - prefix[b])[:, None]).sum(axis=1)
            out[idx] = e * self.n + b * BLOCK + j
        return out
