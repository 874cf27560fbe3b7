"""Shared helpers for the zephon_core tests (tests/unit/core/ and the format tests).

Documents are built so that every token names where it came from: token
``j`` of document ``d`` of source ``s`` is ``encode_token(s, d, j)``. A test
can therefore check a packed row against its provenance, and against the
curriculum, without trusting the code under test.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from zephon_core import MemorySource, Pipeline, StaticMixture
from zephon_core.verify.simulate import Phase, run_phase

_DOC_STRIDE = 10_000
_SRC_STRIDE = 100_000_000


def encode_token(source: int, doc: int, j: int) -> int:
    return source * _SRC_STRIDE + doc * _DOC_STRIDE + j


def doc_length(source: int, doc: int, lo: int = 1, hi: int = 23) -> int:
    """A deterministic, irregular length in [lo, hi]."""
    return lo + (doc * 7919 + source * 104729 + 13) % (hi - lo + 1)


def token_docs(n: int, source: int = 0, lo: int = 1, hi: int = 23) -> list[list[int]]:
    return [[encode_token(source, d, j) for j in range(doc_length(source, d, lo, hi))] for d in range(n)]


def token_source(n: int, source: int = 0, name: str | None = None, lo: int = 1, hi: int = 23) -> MemorySource:
    return MemorySource(token_docs(n, source, lo, hi), name=name or f"src{source}")


def text_docs(n: int, source: int = 0) -> list[str]:
    return [f"s{source}d{d}:" + "abcdefghij"[: 1 + d % 10] * (1 + d % 3) for d in range(n)]


class CharTokenizer:
    """A tiny deterministic tokenizer: one id per character (module level: picklable)."""

    zephon_identity = "tests.CharTokenizer.v1"

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def mixture(
    sizes: Sequence[int] = (400,),
    weights: Sequence[float] | None = None,
    *,
    seed: int = 3,
    chunk_size: int = 8,
    exhausted: str = "repeat",
    shuffle: bool = True,
    lo: int = 1,
    hi: int = 23,
) -> StaticMixture:
    sources = [token_source(n, s, lo=lo, hi=hi) for s, n in enumerate(sizes)]
    return StaticMixture(sources, weights, seed=seed, chunk_size=chunk_size, exhausted=exhausted, shuffle=shuffle)


def token_pipeline(
    ws: StaticMixture | None = None,
    *,
    seq_len: int = 16,
    batch_size: int = 2,
    mode: str = "concat",
    pad_id: int = 0,
    shuffle_window: int | None = None,
    shuffle_seed: int = 0,
    filter_fn: Any = None,
    **options: Any,
) -> Pipeline:
    p = Pipeline(ws if ws is not None else mixture())
    if filter_fn is not None:
        p = p.filter(filter_fn)
    p = p.pack(seq_len, mode=mode, pad_id=pad_id)
    if shuffle_window:
        p = p.shuffle(shuffle_window, seed=shuffle_seed)
    p = p.batch(batch_size)
    options.setdefault("prefetch", 0)
    return p.options(**options)


def take(pipeline: Pipeline, n: int) -> list:
    """The next ``n`` batches of ``pipeline``."""
    it = iter(pipeline)
    return [next(it) for _ in range(n)]


def digests(batches: Iterable) -> list[str]:
    return [b.digest for b in batches]


def write_jsonl(path: Path, records: Iterable[Any], newline: str = "\n") -> Path:
    path.write_text("".join(json.dumps(r) + newline for r in records), encoding="utf-8")
    return path


def json_roundtrip(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=False))


@pytest.fixture(autouse=True)
def zephon_cache_dir(tmp_path_factory, monkeypatch):
    """Every test gets a private JSONL index cache."""
    d = tmp_path_factory.mktemp("zephon-cache")
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(d))
    return d


def epoch_exactly_once(make_source: Any, tokenizer: Any | None, *, block: int | None = None, G1: int = 2, G2: int = 4,
                       first: int = 2, C: int = 4, seq_len: int = 8) -> list[Any]:
    """Every document of ``make_source()`` read through a pipeline over one epoch: ``first`` batches per group
    on ``G1`` groups, a checkpoint, its merge and a resume on ``G2`` groups (``C`` lanes) to the end of the data
    (two phases of the whole-topology simulation, ``zephon_core.verify.simulate``). Asserts that every
    token of every document (and, text sources, its eos) was delivered exactly once, and returns the documents in source order.

    ``tokenizer`` None: the source is pretokenized. Any format's exactly-once property test calls this with a
    factory of that format's source (a new one for every pipeline, as every rank opens its own).
    """

    def make(G: int, g: int) -> Pipeline:
        ws = StaticMixture([make_source()], seed=2, chunk_size=3, exhausted="stop", block_size=block, block_window=2)
        p = Pipeline(ws)
        p = p.tokenize(tokenizer, eos_id=0) if tokenizer is not None else p
        return p.pack(seq_len).batch(1, drop_last=False).options(dp_degree=G, dp_group_id=g, canonical_replicas=C, prefetch=0,
                                                                 reader_threads=g % 2)

    records, merged = run_phase(make, Phase(G1, first), G1, None)
    records += run_phase(make, Phase(G2, None), G2, merged)[0]
    seen = [(s.document, s.start, s.stop) for r in records for row in r.segments for s in row]
    src = make_source()
    docs = src.read(list(range(len(src))))
    for d, doc in enumerate(docs):
        spans = sorted((a, b) for doc_id, a, b in seen if doc_id == d)
        covered = [t for a, b in spans for t in range(a, b)]
        size = len(tokenizer.encode(doc)) + 1 if tokenizer is not None else len(doc)  # +1: the eos token
        assert covered == list(range(size)), f"document {d}: tokens delivered {covered}"
    return docs
