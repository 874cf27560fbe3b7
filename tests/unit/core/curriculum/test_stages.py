"""StagedMixture: stage boundaries, sources added and dropped, token weights, validation (curriculum/stages.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from zephon_core import (
    ConfigError,
    JsonlSource,
    MegatronIndexedSource,
    MemorySource,
    Pipeline,
    Stage,
    StagedMixture,
    StaticMixture,
    TokenArraySource,
    token_counter,
)
from zephon_core.curriculum.work_source import Chunk, WorkSource
from zephon_core.verify.curriculum_audit import audit_curriculum

CORPUS = Path(__file__).resolve().parents[4] / "configs" / "corpus" / "stdlib_docs.jsonl"


def token_sources(sizes=(37, 11, 53), seed=1, min_len=0):
    rng = np.random.default_rng(seed)
    return [MemorySource([list(range(int(rng.integers(min_len, 30)))) for _ in range(n)], name=f"s{i}") for i, n in enumerate(sizes)]


def same_chunk(a: Chunk | None, b: Chunk | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.index == b.index and np.array_equal(a.sources, b.sources) and np.array_equal(a.documents, b.documents)


@pytest.mark.parametrize("exhausted", ["repeat", "stop"])
@pytest.mark.parametrize("shuffle,blocks", [(True, None), (False, None), (True, 4)])
def test_one_document_stage_gives_the_static_mixtures_chunks(exhausted, shuffle, blocks):
    srcs = token_sources()
    order = {"shuffle": shuffle, "block_size": blocks, "block_window": 3}
    static = StaticMixture(srcs, [0.5, 0.2, 0.3], seed=4, chunk_size=16, exhausted=exhausted, **order)
    staged = StagedMixture(srcs, [Stage({"s0": 0.5, "s1": 0.2, "s2": 0.3})], seed=4, chunk_size=16, exhausted=exhausted, **order)
    assert staged.definition().get("order") == static.definition().get("order")
    assert staged.num_chunks == static.num_chunks and staged.chunks_per_epoch == static.chunks_per_epoch
    gs = list(range(60))
    assert all(same_chunk(a, b) for a, b in zip(static.chunks(gs), staged.chunks(gs)))


def three_stages(**kw):
    return [
        Stage({"s0": 1, "s1": 1}, name="warm"),
        Stage({"s1": 1, "s2": 3}, name="main", start_chunk=7, weight_by="tokens"),
        Stage({"s0": 2, "s2": 1}, name="anneal", start_chunk=42, **kw),
    ]


def test_sources_dropped_and_added_continue_exactly_where_they_stood():
    srcs = token_sources()
    ws = StagedMixture(srcs, three_stages(), seed=4, chunk_size=16)
    sched = ws.schedule
    # s0: 8 per chunk in warm-up (chunks 0-6), absent in "main" (7-41), back in "anneal" where it left off.
    assert [p.start_chunk for p in sched.plans] == [0, 7, 42]
    assert sched.position(0, 7) == sched.position(0, 42) == 7 * sched.plans[0].per_chunk[0]
    assert sched.position(0, 43) == sched.position(0, 42) + sched.plans[2].per_chunk[0]
    assert sched.position(2, 7) == 0  # s2 first read in "main"
    chunks = ws.chunks(list(range(42, 44)))
    assert {int(s) for c in chunks if c for s in c.sources} == {0, 2}
    audit = audit_curriculum(ws, 300)
    assert not audit.problems and audit.chunks == 300
    assert audit.used == [sched.position(s, 300) for s in range(3)]


def test_a_chunk_far_out_is_computed_from_its_number_alone():
    ws = StagedMixture(token_sources(), three_stages(), seed=4, chunk_size=16)
    g = 10**9
    t0 = time.perf_counter()
    alone = ws.chunk(g)
    assert time.perf_counter() - t0 < 5  # no walk over the chunks before it
    assert same_chunk(alone, ws.chunks([3, g, 8])[1])
    assert same_chunk(alone, StagedMixture(token_sources(), three_stages(), seed=4, chunk_size=16).chunk(g))


class RepeatsOneDocument(WorkSource):
    """A broken curriculum: chunk 5 reads again, instead of one of its own, a document of source 0 that chunk 0 read."""

    def __init__(self, inner: StagedMixture) -> None:
        self.inner, self.sources = inner, inner.sources

    def chunks(self, gs):
        out = []
        first = self.inner.chunk(0)
        for c in self.inner.chunks(gs):
            if c is not None and c.index == 5:
                docs = c.documents.copy()
                docs[np.flatnonzero(c.sources == 0)[0]] = first.documents[first.sources == 0][0]
                c = Chunk(c.index, c.sources, docs)
            out.append(c)
        return out

    chunks_per_epoch = property(lambda self: self.inner.chunks_per_epoch)
    num_chunks = property(lambda self: self.inner.num_chunks)

    def definition(self):
        return self.inner.definition()

    def describe(self):
        return []


def test_the_audit_finds_a_document_repeated_within_an_epoch():
    ws = StagedMixture(token_sources(sizes=(200, 20, 20)), three_stages(), seed=4, chunk_size=16)
    problems = audit_curriculum(RepeatsOneDocument(ws), 20).problems
    assert problems and "after global chunk 5: source 's0'" in problems[0]


def test_token_quotas_hold_across_empty_documents_and_epochs():
    docs = [[1] * n for n in [0, 0, 5, 0, 1, 0, 0, 9, 0, 2, 0, 0]]
    srcs = [MemorySource(docs, name="sparse"), MemorySource([[2] * 3] * 7, name="flat")]
    ws = StagedMixture(srcs, [Stage({"flat": 1}, name="a"), Stage({"sparse": 1, "flat": 1}, name="b", start_chunk=3, weight_by="tokens")],
                       seed=9, chunk_size=8)
    assert not audit_curriculum(ws, 400).problems
    q = ws.schedule.plans[1].per_chunk[0]
    got = sum(len(docs[d]) for c in ws.chunks(list(range(3, 400))) for d in c.documents[c.sources == 0])
    assert 397 * q <= got < 397 * q + 9


def test_stop_ends_with_a_source_of_the_current_stage():
    srcs = token_sources(sizes=(20, 500, 40))
    # s0 (20 documents) is exhausted in stage "a" unless the stage ends first; s1 is large.
    short = StagedMixture(srcs, [Stage({"s0": 1, "s1": 1}, name="a"), Stage({"s1": 1, "s2": 1}, name="b", start_chunk=2)],
                          seed=1, chunk_size=8, exhausted="stop")
    assert short.num_chunks == 2 + 10  # s2: 40 documents, 4 per chunk, from chunk 2
    long = StagedMixture(srcs, [Stage({"s0": 1, "s1": 1}, name="a"), Stage({"s1": 1, "s2": 1}, name="b", start_chunk=20)],
                         seed=1, chunk_size=8, exhausted="stop")
    assert long.num_chunks == 5  # s0: 20 documents, 4 per chunk
    assert long.chunk(5) is None and len(long.chunk(4)) == 8


def test_token_and_step_boundaries_become_the_first_chunk_that_reaches_them():
    srcs = [TokenArraySource(np.arange(1000) % 50, np.array([0, 100, 400, 450, 1000])),
            MemorySource([[1] * 10] * 30, name="ten")]
    srcs[0].name = "arr"
    stages = [Stage({"arr": 1, "ten": 1}, name="a"), Stage({"ten": 1}, name="b", start_tokens=5000),
              Stage({"arr": 1}, name="c", start_step=10)]
    ws = StagedMixture(srcs, stages, seed=0, chunk_size=4, tokens_per_step=1000)
    per_chunk = 2 * 250 + 2 * 10  # two documents of each: mean 250 and 10 tokens
    b, c = ws.schedule.plans[1], ws.schedule.plans[2]
    assert b.start_chunk == -(-5000 // per_chunk) and b.tokens_before >= 5000 > b.tokens_before - per_chunk
    assert c.tokens_before >= 10_000 > c.tokens_before - 40 and c.start_chunk == b.start_chunk + -(-(10_000 - b.tokens_before) // 40)
    defn = ws.definition()
    assert defn["stages"][2]["start"] == {"step": 10, "tokens_per_step": 1000}
    assert defn["token_estimates"] == {"arr": {"method": "exact"}, "ten": {"method": "exact"}}
    text = "\n".join(ws.describe())
    assert "stage 2 'c': chunks" in text and "start_step=10 x 1000 tokens" in text and "not read: ten" in text


def test_pretokenized_sources_know_their_token_counts(tmp_path):
    pytest.importorskip("megatron.core.datasets.indexed_dataset")
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    docs = [np.arange(n, dtype=np.int32) for n in (3, 0, 7, 1)]
    prefix = str(tmp_path / "d")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    for d in docs:
        builder.add_document(torch.from_numpy(d), [len(d)] if len(d) else [])
    builder.finalize(prefix + ".idx")
    src = MegatronIndexedSource(prefix)
    assert src.token_lengths().tolist() == [len(x) for x in src.read(range(len(src)))]
    arr = TokenArraySource(np.arange(11), np.array([0, 3, 3, 10, 11]))
    assert arr.token_lengths().tolist() == [3, 0, 7, 1]


def test_text_tokens_are_estimated_from_stored_bytes_and_a_measured_ratio(tmp_path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(CORPUS.parent / "tokenizer.json"))
    src = JsonlSource(str(CORPUS), name="docs")
    ws = StagedMixture([src], [Stage({"docs": 1}, weight_by="tokens")], chunk_size=8, token_counter=token_counter(tok, eos_id=1))
    method = ws.definition()["token_estimates"]["docs"]
    assert method["method"] == "bytes" and method["sample"] == 256
    true = np.array([len(x) + 1 for x in (e.ids for e in tok.encode_batch(src.read(range(len(src))), add_special_tokens=False))])
    est = ws.schedule.tokens[0].lengths
    assert abs(est.sum() / true.sum() - 1) < 0.05  # the estimate of the whole corpus, from 256 sampled documents
    # Without stored sizes (MemorySource of dicts has them; a source that does not): every document is the sample mean.
    texts = MemorySource(src.read(range(40)), name="t")
    texts.byte_lengths = lambda: None  # type: ignore[method-assign]
    flat = StagedMixture([texts], [Stage({"t": 1}, weight_by="tokens")], chunk_size=8, token_counter=token_counter(tok, eos_id=1))
    assert flat.definition()["token_estimates"]["t"]["method"] == "sample_mean"
    with pytest.raises(ConfigError, match="needs token_counter"):
        StagedMixture([texts], [Stage({"t": 1}, weight_by="tokens")], chunk_size=8)


@pytest.mark.parametrize(
    "stages,match",
    [
        ([], "needs at least one stage"),
        ([Stage({"s0x": 1})], "unknown source 's0x'; did you mean 's0'"),
        ([Stage({"s0": -1, "s1": 1, "s2": 1})], r"stages\[0\] \('stage0'\).weights.s0: must be a finite number >= 0"),
        ([Stage({"s0": 0})], "at least one source needs a weight > 0"),
        ([Stage({"s0": 1}, start_chunk=3)], "the first stage starts at the beginning of the run; remove its start_chunk"),
        ([Stage({"s0": 1, "s1": 1, "s2": 1}), Stage({"s0": 1})], r"stages\[1\] \('stage1'\): give exactly one of"),
        ([Stage({"s0": 1, "s1": 1, "s2": 1}), Stage({"s0": 1}, start_chunk=2, start_tokens=5)], "give exactly one of"),
        ([Stage({"s0": 1, "s1": 1, "s2": 1}, name="a"), Stage({"s0": 1}, name="a", start_chunk=2)], "name is also that of stages"),
        ([Stage({"s0": 1, "s1": 1, "s2": 1}), Stage({"s0": 1}, start_step=2)], "start_step: converting steps to tokens needs"),
        ([Stage({"s0": 1, "s1": 1})], r"source\(s\) 's2' are in no stage"),
        ([Stage({"s0": 1, "s1": 1, "s2": 1}), Stage({"s0": 1}, start_chunk=5), Stage({"s1": 1}, start_chunk=5)], "must be after stages"),
        ([Stage({"s0": 1, "s1": 1, "s2": 1}, weight_by="bytes")], "weight_by must be one of"),
        ([Stage({"s0": 100, "s1": 1, "s2": 1})], "weights.s1 is too small to get one of the 16 documents of a chunk; raise chunk_size to at least 102"),
    ],
)
def test_invalid_schedules_are_refused_naming_the_stage_and_field(stages, match):
    with pytest.raises(ConfigError, match=match):
        StagedMixture(token_sources(), stages, chunk_size=16)


def test_sources_need_distinct_names():
    a, b = token_sources()[:2]
    b.name = a.name
    with pytest.raises(ConfigError, match="both named 's0'; give every source a distinct name"):
        StagedMixture([a, b], [Stage({"s0": 1})])


def pipeline(ws, C=4, **kw):
    return Pipeline(ws).pack(8).shuffle(3).batch(2).options(canonical_replicas=C, dp_degree=C, dp_group_id=0, prefetch=0, **kw)


def test_restoring_deep_into_a_staged_run_reads_no_more_than_near_its_start():
    from support.property_strategies import CountingMemorySource

    def reads(batches):
        with pipeline(StagedMixture(token_sources(min_len=1), three_stages(), seed=2, chunk_size=16)) as p:
            it = iter(p)
            for _ in range(batches):
                next(it)
            state = json.loads(json.dumps(p.checkpoint()))
        counting = [CountingMemorySource([list(d) for d in s.read(range(len(s)))], name=s.name) for s in token_sources(min_len=1)]
        with pipeline(StagedMixture(counting, three_stages(), seed=2, chunk_size=16), reader_threads=0, readahead=0) as q:
            q.restore(state)
            next(iter(q))
        return state["lanes"]["0"]["cursor"][0], sum(s.reads for s in counting)

    (early_chunk, early), (late_chunk, late) = reads(3), reads(600)
    assert late_chunk * 4 > 42 > early_chunk * 4  # the late state is in the third stage, the early one in the first
    assert late <= 2 * max(early, 32)


@pytest.mark.parametrize("full_prefix", [True, False])
def test_the_token_index_agrees_with_a_running_sum_of_the_stream(monkeypatch, full_prefix):
    from zephon_core.curriculum import token_index
    from zephon_core.curriculum.order import EpochPermutation, SourceOrder
    from zephon_core.curriculum.token_index import DocumentTokens, TokenIndex

    monkeypatch.setattr(token_index, "FULL_PREFIX", 10**9 if full_prefix else 0)
    monkeypatch.setattr(token_index, "BLOCK", 8)
    rng = np.random.default_rng(5)
    for trial in range(60):
        n = int(rng.integers(1, 300))
        lengths = (rng.integers(0, 5, n) * (rng.random(n) < 0.7)).astype(np.int64)
        lengths[0] += not lengths.any()
        order = EpochPermutation(n, trial, 0) if trial % 2 else SourceOrder(n)
        index = TokenIndex(DocumentTokens(lengths, {"method": "exact"}), order, "t")
        stream = np.concatenate([lengths[order.documents(np.arange(e * n, (e + 1) * n))] for e in range(3)])
        running = np.concatenate([[0], np.cumsum(stream)])
        p = rng.integers(0, 3 * n, 40)
        assert np.array_equal(index.cumstart(p), running[p])
        x = rng.integers(0, 2 * lengths.sum() + 1, 40)
        assert np.array_equal(index.position_at(x), np.searchsorted(running, x, side="left"))
        assert np.array_equal(index.documents(p), order.documents(p))


def test_a_many_file_source_knows_its_documents_sizes_across_its_files(tmp_path):
    lines = CORPUS.read_text(encoding="utf-8").splitlines(keepends=True)[:60]
    (tmp_path / "shards").mkdir()
    for k in range(3):
        (tmp_path / "shards" / f"part-{k}.jsonl").write_text("".join(lines[k * 20 : (k + 1) * 20]), encoding="utf-8")
    many = JsonlSource(str(tmp_path / "shards"), name="many")
    one = JsonlSource(str(CORPUS), name="one")
    assert len(many) == 60 and many.byte_lengths().tolist() == one.byte_lengths()[:60].tolist()
