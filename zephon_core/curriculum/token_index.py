"""Tokens along a source's stream: how many precede a stream position, and which position a token count reaches.

Token-weighted stages (``weight_by="tokens"``) give each source a token quota
per chunk: chunk ``g`` takes the documents whose first token falls in its
quota. That needs, for any stream position ``p``, the tokens of the documents
at positions ``0 .. p-1`` (``cumstart``) and the inverse (``position_at``),
both as pure functions of ``p`` so that chunks stay seekable.

``TokenIndex`` answers both from the per-document token counts and the
source's order, keeping per epoch only the token sums of blocks of ``BLOCK``
consecutive stream positions (8 bytes per ``BLOCK`` documents); a query
evaluates the order inside one block. Building an epoch's block sums is one
pass of the order over the source (``docs/performance.md`` measures it).

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

BLOCK = 256
SAMPLE = 256
_PASS = 1 << 20  # stream positions mapped at once while building an epoch's block sums
_EPOCHS_KEPT = 8

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
        self._lengths = tokens.lengths
        self._order = order
        self._blocks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def _epoch(self, e: int) -> np.ndarray:
        """Tokens before each block of epoch ``e`` (``nb + 1`` entries, the last the epoch's total)."""
        with self._lock:
            if e in self._blocks:
                self._blocks.move_to_end(e)
                return self._blocks[e]
            n = self.n
            sums = []
            for a in range(0, n, _PASS):
                pos = np.arange(e * n + a, e * n + min(n, a + _PASS), dtype=np.int64)
                lens = self._lengths[self._order.documents(pos)]
                pad = (-len(lens)) % BLOCK
                sums.append(np.concatenate([lens, np.zeros(pad, np.int64)]).reshape(-1, BLOCK).sum(axis=1))
            prefix = np.concatenate([[0], np.cumsum(np.concatenate(sums))]).astype(np.int64)
            self._blocks[e] = prefix
            if len(self._blocks) > _EPOCHS_KEPT:
                self._blocks.popitem(last=False)
            return prefix

    def _within(self, epochs: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """Row ``j``: tokens before each of the ``BLOCK + 1`` positions of block ``blocks[j]`` of epoch ``epochs[j]``."""
        local = blocks[:, None] * BLOCK + np.arange(BLOCK, dtype=np.int64)
        inside = local < self.n
        pos = epochs[:, None] * self.n + np.minimum(local, self.n - 1)
        lens = np.where(inside, self._lengths[self._order.documents(pos.ravel())].reshape(pos.shape), 0)
        out = np.zeros((len(blocks), BLOCK + 1), dtype=np.int64)
        np.cumsum(lens, axis=1, out=out[:, 1:])
        return out

    def _tables(self, epochs: np.ndarray, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per query: the tokens before its block, and its block's within-table (one evaluation per distinct block)."""
        key = np.stack([epochs, blocks], axis=1)
        uniq, inverse = np.unique(key, axis=0, return_inverse=True)
        inverse = inverse.ravel()
        before = np.array([self._epoch(int(e))[int(b)] for e, b in uniq], dtype=np.int64)
        return before[inverse], self._within(uniq[:, 0], uniq[:, 1])[inverse]

    def cumstart(self, positions: np.ndarray) -> np.ndarray:
        """Tokens of the documents at stream positions ``0 .. p-1``, for each ``p``."""
        p = np.asarray(positions, dtype=np.int64)
        if not p.size:
            return p.copy()
        e, r = np.divmod(p, self.n)
        b = r // BLOCK
        before, within = self._tables(e, b)
        return e * self.total + before + within[np.arange(len(p)), r - b * BLOCK]

    def position_at(self, tokens: np.ndarray) -> np.ndarray:
        """The first stream position ``p`` with ``cumstart(p) >= x``, for each ``x >= 0``."""
        x = np.asarray(tokens, dtype=np.int64)
        out = np.zeros_like(x)
        live = x > 0
        if not live.any():
            return out
        xs = x[live]
        # x in (e*total, (e+1)*total] is reached inside epoch e: trailing empty documents of an
        # epoch precede the next one's first position.
        e = (xs - 1) // self.total
        r = xs - e * self.total
        b = np.array([np.searchsorted(self._epoch(int(ei)), ri, side="left") - 1 for ei, ri in zip(e, r)], dtype=np.int64)
        before, within = self._tables(e, b)
        j = (within < (r - before)[:, None]).sum(axis=1)
        out[live] = e * self.n + b * BLOCK + j
        return out
