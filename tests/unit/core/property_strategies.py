"""Hypothesis strategies and helpers for ``test_properties.py``.

Everything a process pool may have to pickle (the map and tokenize functions)
lives here at module level, in a module that is importable by name from the
worker processes (pytest puts ``tests/unit`` on ``sys.path``).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from zephon_core import MemorySource, Pipeline, StaticMixture

CANONICAL_REPLICAS = (1, 2, 3, 4, 6, 8, 12)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# -- module-level functions for map / tokenize (picklable) ---------------------
def reverse_and_mark(text: str) -> str:
    """A deterministic map over text documents."""
    return text[::-1] + "#"


def keep_text(text: str) -> bool:
    """A deterministic filter: drops mapped texts whose length is a multiple of 4."""
    return len(text) % 4 != 0


def char_tokenizer(text: str) -> list[int]:
    """A deterministic toy tokenizer: one id per character."""
    return [(ord(c) * 7 + 3) % 251 for c in text]


# -- a source that counts what it reads -----------------------------------------
class CountingMemorySource(MemorySource):
    """A ``MemorySource`` that counts the documents read through it.

    Its fingerprint is the plain ``MemorySource`` one, so pipelines over it and
    over an equal ``MemorySource`` share checkpoints.
    """

    def __init__(self, documents: Any, name: str = "memory") -> None:
        super().__init__(documents, name)
        self._count_lock = threading.Lock()
        self.reads = 0

    def read(self, indices: Sequence[int]) -> list[Any]:
        with self._count_lock:
            self.reads += len(indices)
        return super().read(indices)


# -- recipes --------------------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    """Everything that defines the data, in plain values (prints well on failure)."""

    docs: tuple[tuple[tuple[int, ...], ...], ...]  # per source, per document, tokens
    weights: tuple[float, ...]
    seed: int
    chunk_size: int
    seq_len: int
    mode: str
    shuffle_window: int | None
    shuffle_seed: int
    batch_size: int
    exhausted: str = "repeat"
    drop_last: bool = True

    def sources(self, cls: type[MemorySource] = MemorySource) -> list[MemorySource]:
        return [cls([list(d) for d in docs], name=f"src{i}") for i, docs in enumerate(self.docs)]

    def pipeline(self, sources: Sequence[MemorySource] | None = None) -> Pipeline:
        srcs = list(sources) if sources is not None else self.sources()
        ws = StaticMixture(srcs, list(self.weights), seed=self.seed, chunk_size=self.chunk_size, exhausted=self.exhausted)
        p = Pipeline(ws).pack(self.seq_len, mode=self.mode)
        if self.shuffle_window is not None:
            p = p.shuffle(self.shuffle_window, seed=self.shuffle_seed)
        return p.batch(self.batch_size, drop_last=self.drop_last)


def _source_docs(min_len: int, max_len: int, max_docs: int) -> st.SearchStrategy[tuple[tuple[int, ...], ...]]:
    doc = st.lists(st.integers(0, 40), min_size=min_len, max_size=max_len).map(tuple)
    # At least one non-empty document per source, so a repeating curriculum always makes progress.
    return st.lists(doc, min_size=1, max_size=max_docs).filter(lambda ds: any(ds)).map(tuple)


@st.composite
def recipes(
    draw: st.DrawFn, *, min_doc_len: int = 0, max_doc_len: int = 24, max_docs: int = 12, max_seq_len: int = 12, finite: bool = False
) -> Recipe:
    """Token recipes; ``finite=True`` also draws ``exhausted="stop"`` and ``drop_last=False``."""
    n_sources = draw(st.integers(1, 3))
    docs = tuple(draw(_source_docs(min_doc_len, max_doc_len, max_docs)) for _ in range(n_sources))
    weights = tuple(draw(st.lists(st.floats(0.5, 4.0, allow_nan=False, allow_infinity=False), min_size=n_sources, max_size=n_sources)))
    # chunk_size large enough that every source gets at least one document (weights within 8x of each other).
    chunk_size = draw(st.integers(max(1, 8 * (n_sources - 1) + 1) if n_sources > 1 else 1, 12 if n_sources == 1 else 24))
    return Recipe(
        docs=docs,
        weights=weights,
        seed=draw(st.integers(0, 2**31 - 1)),
        chunk_size=chunk_size,
        seq_len=draw(st.integers(1, max_seq_len)),
        mode=draw(st.sampled_from(["concat", "pad"])),
        shuffle_window=draw(st.one_of(st.none(), st.integers(1, 6))),
        shuffle_seed=draw(st.integers(0, 1000)),
        batch_size=draw(st.integers(1, 3)),
        exhausted=draw(st.sampled_from(["repeat", "stop"])) if finite else "repeat",
        drop_last=draw(st.booleans()) if finite else True,
    )


@dataclass(frozen=True)
class TextRecipe:
    texts: tuple[tuple[str, ...], ...]
    weights: tuple[float, ...]
    seed: int
    chunk_size: int
    seq_len: int
    mode: str
    shuffle_window: int | None
    batch_size: int

    def pipeline(self, *, map_parallelism: int, tok_parallelism: int, runner: str) -> Pipeline:
        srcs = [MemorySource(list(t), name=f"text{i}") for i, t in enumerate(self.texts)]
        p = Pipeline(StaticMixture(srcs, list(self.weights), seed=self.seed, chunk_size=self.chunk_size))
        p = p.map(reverse_and_mark, parallelism=map_parallelism, runner=runner)
        p = p.filter(keep_text, parallelism=map_parallelism, runner=runner)
        p = p.tokenize(char_tokenizer, eos_id=0, parallelism=tok_parallelism, runner=runner)
        p = p.pack(self.seq_len, mode=self.mode)
        if self.shuffle_window is not None:
            p = p.shuffle(self.shuffle_window, seed=3)
        return p.batch(self.batch_size)


@st.composite
def text_recipes(draw: st.DrawFn) -> TextRecipe:
    n_sources = draw(st.integers(1, 3))
    text = st.text(alphabet="abcdefghij klmnop", min_size=0, max_size=20)
    # Every source keeps at least one document through the filter, so a repeating curriculum always makes progress.
    texts = tuple(
        tuple(draw(st.lists(text, min_size=1, max_size=10).filter(lambda ts: any(keep_text(reverse_and_mark(t)) for t in ts))))
        for _ in range(n_sources)
    )
    weights = tuple(draw(st.lists(st.floats(0.5, 4.0), min_size=n_sources, max_size=n_sources)))
    return TextRecipe(
        texts=texts,
        weights=weights,
        seed=draw(st.integers(0, 2**31 - 1)),
        chunk_size=draw(st.integers(8 * (n_sources - 1) + 1 if n_sources > 1 else 2, 24)),
        seq_len=draw(st.integers(1, 12)),
        mode=draw(st.sampled_from(["concat", "pad"])),
        shuffle_window=draw(st.one_of(st.none(), st.integers(1, 5))),
        batch_size=draw(st.integers(1, 3)),
    )


# -- comparing batches ------------------------------------------------------------
def batch_key(b: Any) -> tuple[Any, ...]:
    """Everything a batch carries, as comparable bytes and values."""
    return (
        b.input_ids.dtype.str,
        b.input_ids.shape,
        b.input_ids.tobytes(),
        b.labels.tobytes(),
        b.positions.tobytes(),
        b.loss_mask.tobytes(),
        b.lane,
        b.lane_index,
        tuple(b.cursor),
        b.provenance,
    )


def rows_of(b: Any) -> list[tuple[str, tuple[Any, ...]]]:
    """One (content digest, provenance) per row."""
    return list(zip(b.row_digests(), b.provenance))


def row_counter(batches: Sequence[Any]) -> Counter[tuple[str, tuple[Any, ...]]]:
    c: Counter[tuple[str, tuple[Any, ...]]] = Counter()
    for b in batches:
        c.update(rows_of(b))
    return c
