"""Hypothesis strategies and helpers for the property tests.

Everything a process pool may have to pickle (the map and tokenize functions)
lives here at module level, in a module that is importable by name from the
worker processes (``support.property_strategies``: pytest puts ``tests/`` on the path,
and a spawned worker starts with its parent's path).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from zephon_core import MemorySource, Pipeline, Stage, StagedMixture, StaticMixture

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
    pack_options: tuple[tuple[str, Any], ...] = ()  # more keywords of pack() (window, overlong, max_docs_per_row)

    def sources(self, cls: type[MemorySource] = MemorySource) -> list[MemorySource]:
        return [cls([list(d) for d in docs], name=f"src{i}") for i, docs in enumerate(self.docs)]

    def pipeline(self, sources: Sequence[MemorySource] | None = None) -> Pipeline:
        srcs = list(sources) if sources is not None else self.sources()
        ws = StaticMixture(srcs, list(self.weights), seed=self.seed, chunk_size=self.chunk_size, exhausted=self.exhausted)
        p = Pipeline(ws).pack(self.seq_len, mode=self.mode, **dict(self.pack_options))
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
class Shape:
    """The fields every generated recipe has besides its sources."""

    seed: int
    chunk_size: int
    seq_len: int
    mode: str
    shuffle_window: int | None
    batch_size: int


@dataclass(frozen=True)
class TextRecipe(Shape):
    texts: tuple[tuple[str, ...], ...]
    weights: tuple[float, ...]

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


# -- staged recipes -----------------------------------------------------------------
@dataclass(frozen=True)
class StagedRecipe(Shape):
    """A staged curriculum over token sources, in plain values: per stage (start chunk, weight_by, weights by source)."""

    docs: tuple[tuple[tuple[int, ...], ...], ...]
    stages: tuple[tuple[int, str, tuple[float, ...]], ...]  # (start_chunk, weight_by, weight per source; 0: absent)
    exhausted: str = "repeat"

    def sources(self, cls: type[MemorySource] = MemorySource) -> list[MemorySource]:
        return [cls([list(d) for d in docs], name=f"src{i}") for i, docs in enumerate(self.docs)]

    def stage_objects(self, upto: int | None = None) -> list[Stage]:
        out = []
        for i, (start, by, weights) in enumerate(self.stages[:upto]):
            out.append(Stage({f"src{s}": w for s, w in enumerate(weights) if w > 0}, f"s{i}", start_chunk=start or None, weight_by=by))
        return out

    def work_source(self, sources: Sequence[MemorySource] | None = None, upto: int | None = None) -> StagedMixture:
        srcs = list(sources) if sources is not None else self.sources()
        stages = self.stage_objects(upto)
        used = {n for st in stages for n in st.weights}
        # A prefix of the schedule reads only the sources its stages name: the rest are appended with the later stages.
        kept = [s for s in srcs if s.name in used] if upto is not None else srcs
        return StagedMixture(kept, stages, seed=self.seed, chunk_size=self.chunk_size, exhausted=self.exhausted)

    def pipeline(self, sources: Sequence[MemorySource] | None = None, upto: int | None = None) -> Pipeline:
        p = Pipeline(self.work_source(sources, upto)).pack(self.seq_len, mode=self.mode)
        if self.shuffle_window is not None:
            p = p.shuffle(self.shuffle_window, seed=5)
        return p.batch(self.batch_size, drop_last=True)


@st.composite
def staged_recipes(draw: st.DrawFn, *, max_stages: int = 3, finite: bool = False) -> StagedRecipe:
    """1-3 sources and 1-3 stages at increasing chunks, each over a random non-empty subset of the sources,
    weighted by documents or tokens. Every source is in some stage, and sources are numbered in the order
    stages first read them, so a prefix of the schedule only ever needs a prefix of the sources."""
    n_sources = draw(st.integers(1, 3))
    n_stages = draw(st.integers(1, max_stages))
    subsets = [sorted(draw(st.sets(st.integers(0, n_sources - 1), min_size=1))) for _ in range(n_stages)]
    subsets[-1] = sorted(set(subsets[-1]) | (set(range(n_sources)) - {s for sub in subsets for s in sub}))
    order: list[int] = []
    for sub in subsets:
        order += [s for s in sub if s not in order]
    rank = {s: i for i, s in enumerate(order)}
    starts = [0] + sorted(draw(st.sets(st.integers(1, 12), min_size=n_stages - 1, max_size=n_stages - 1)))
    stages = []
    for start, sub in zip(starts, subsets):
        chosen = {rank[s] for s in sub}
        weights = tuple(draw(st.floats(0.5, 3.0)) if s in chosen else 0.0 for s in range(n_sources))
        stages.append((start, draw(st.sampled_from(["documents", "tokens"])), weights))
    # Documents of 0-16 tokens, at least one token per document on average (token quotas stay >= 1).
    docs = tuple(draw(_source_docs(0, 16, 10).filter(lambda ds: sum(map(len, ds)) >= len(ds))) for _ in range(n_sources))
    return StagedRecipe(
        docs=docs,
        stages=tuple(stages),
        seed=draw(st.integers(0, 2**31 - 1)),
        chunk_size=draw(st.integers(8 * n_sources, 24)),
        seq_len=draw(st.integers(1, 10)),
        mode=draw(st.sampled_from(["concat", "pad"])),
        shuffle_window=draw(st.one_of(st.none(), st.integers(2, 5))),
        batch_size=draw(st.integers(1, 3)),
        exhausted=draw(st.sampled_from(["repeat", "stop"])) if finite else "repeat",
    )


# -- a stage appended at a checkpoint inside a shuffle window --------------------------
@dataclass(frozen=True)
class WindowResume(Shape):
    """A one-stage curriculum checkpointed after ``batches`` batches, most often inside a shuffle window, and a
    stage over a source of documents of ``late_len`` tokens (far shorter or longer than the first stage's)
    first appended at chunk ``appended_at``."""

    docs: tuple[tuple[int, ...], ...]
    late_len: int
    mixed: bool  # the appended stage also reads the first stage's source
    canonical_replicas: int
    batches: int
    appended_at: int

    def pipeline(self, appended_at: int | None = None) -> Pipeline:
        sources = [MemorySource([list(d) for d in self.docs], name="early")]
        stages = [Stage({"early": 1}, "early")]
        if appended_at is not None:
            sources.append(MemorySource([[5] * self.late_len] * 7, name="late"))
            stages.append(Stage({"late": 1, "early": 1 if self.mixed else 0}, "late", start_chunk=appended_at))
        ws = StagedMixture(sources, stages, seed=self.seed, chunk_size=self.chunk_size)
        p = Pipeline(ws).pack(self.seq_len, mode=self.mode).shuffle(self.shuffle_window or 1, seed=2)
        p = p.batch(self.batch_size)
        return p.options(canonical_replicas=self.canonical_replicas, dp_degree=1, dp_group_id=0, prefetch=0)


@st.composite
def window_resumes(draw: st.DrawFn) -> WindowResume:
    """Small chunks and windows of up to 30 rows: a window holds several chunks, often the appended stage's first."""
    return WindowResume(
        docs=draw(_source_docs(1, 12, 12)),
        late_len=draw(st.sampled_from([1, 2, 30, 60])),
        mixed=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
        chunk_size=draw(st.integers(2, 6)),
        seq_len=draw(st.integers(2, 8)),
        mode=draw(st.sampled_from(["concat", "pad"])),
        shuffle_window=draw(st.integers(4, 30)),
        batch_size=draw(st.integers(1, 2)),
        canonical_replicas=draw(st.integers(1, 3)),
        batches=draw(st.integers(1, 30)),
        appended_at=draw(st.integers(1, 30)),
    )
