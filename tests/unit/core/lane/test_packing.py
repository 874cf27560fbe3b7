"""Packing, batches and delivery order.

Every token of the test corpora names its source, document and offset (see
core_fixtures.encode_token), so rows are checked against the sources and the
curriculum directly.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.core_fixtures import CharTokenizer, digests, encode_token, mixture, take, text_docs, token_pipeline

from zephon_core import Batch, Cursor, MemorySource, Pipeline, StaticMixture
from zephon_core.verify.simulate import Phase, run_phase


def _row_tokens(b: Batch, r: int) -> np.ndarray:
    """The L+1 tokens of row r: inputs plus the last label."""
    return np.concatenate([b.input_ids[r], b.labels[r, -1:]])


def _from_provenance(ws: StaticMixture, segments) -> np.ndarray:
    parts = [ws.sources[s.source].read([s.document])[0][s.start : s.stop] for s in segments]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _lane_documents(ws: StaticMixture, lane: int, C: int, chunks: int):
    """(source, document) in the order lane ``lane`` meets them, for its first ``chunks`` chunks."""
    out = []
    for k in range(chunks):
        c = ws.chunk(lane + k * C)
        out.extend(zip(c.sources.tolist(), c.documents.tolist()))
    return out


# -- concat -------------------------------------------------------------------
@pytest.mark.parametrize("seq_len", [1, 7, 16, 50])
def test_concat_rows_and_labels(seq_len):
    ws = mixture((300, 200), [2, 1], chunk_size=6)
    batches = take(token_pipeline(ws, seq_len=seq_len, batch_size=3), 6)
    for b in batches:
        assert b.input_ids.shape == b.labels.shape == b.positions.shape == b.loss_mask.shape == (3, seq_len)
        assert b.loss_mask.all()  # concat rows of an infinite curriculum have no padding
        np.testing.assert_array_equal(b.labels[:, :-1], b.input_ids[:, 1:])
        for r, segments in enumerate(b.provenance):
            tokens = _row_tokens(b, r)
            assert len(tokens) == seq_len + 1
            assert sum(s.stop - s.start for s in segments) == seq_len + 1
            np.testing.assert_array_equal(tokens, _from_provenance(ws, segments))


def test_concat_consumes_every_token_of_the_lane_in_curriculum_order():
    ws = mixture((300, 200), [2, 1], chunk_size=6)
    batches = take(token_pipeline(ws, seq_len=13, batch_size=2), 10)
    segments = [s for b in batches for row in b.provenance for s in row]
    # Merge consecutive stretches of a document; each must be the whole document, from 0.
    docs = []
    for s in segments:
        if docs and docs[-1][:2] == (s.source, s.document) and docs[-1][3] == s.start:
            docs[-1] = (s.source, s.document, docs[-1][2], s.stop)
        else:
            assert s.start == 0, f"document {s.document} does not start at token 0"
            docs.append((s.source, s.document, s.start, s.stop))
    expected = _lane_documents(ws, 0, 1, 20)
    assert [(s, d) for s, d, _, _ in docs] == expected[: len(docs)]
    for s, d, _start, stop in docs[:-1]:  # the last one may be cut by the batch end
        assert stop == len(ws.sources[s].read([d])[0])


def test_positions_restart_at_document_and_row_boundaries():
    ws = mixture((300,), chunk_size=6)
    for b in take(token_pipeline(ws, seq_len=20, batch_size=2), 5):
        for r, segments in enumerate(b.provenance):
            expected = np.concatenate([np.arange(s.stop - s.start) for s in segments])[:-1]
            np.testing.assert_array_equal(b.positions[r], expected)
            assert b.positions[r, 0] == 0


def test_filter_and_map_change_what_is_packed():
    ws = mixture((300,), chunk_size=6)
    p = Pipeline(ws).filter(lambda d: len(d) % 2 == 0).map(lambda d: d[::-1]).pack(10).batch(2).options(prefetch=0)
    for b in take(p, 4):
        for r, segments in enumerate(b.provenance):
            for s in segments:
                doc = ws.sources[0].read([s.document])[0]
                assert len(doc) % 2 == 0
            tokens = _row_tokens(b, r)
            parts = [ws.sources[0].read([s.document])[0][::-1][s.start : s.stop] for s in segments]
            np.testing.assert_array_equal(tokens, np.concatenate(parts))


# -- pad ------------------------------------------------------------------------
@pytest.mark.parametrize("seq_len", [9, 16])
def test_pad_mode_keeps_documents_whole(seq_len):
    ws = mixture((300,), chunk_size=6, lo=1, hi=2 * seq_len + 5)
    pad = -7
    batches = take(token_pipeline(ws, seq_len=seq_len, batch_size=2, mode="pad", pad_id=pad), 12)
    width = seq_len + 1
    saw_padding = saw_split = False
    for b in batches:
        for r, segments in enumerate(b.provenance):
            tokens = _row_tokens(b, r)
            filled = sum(s.stop - s.start for s in segments)
            np.testing.assert_array_equal(tokens[:filled], _from_provenance(ws, segments))
            assert (tokens[filled:] == pad).all()
            # loss only where the label is a real token
            np.testing.assert_array_equal(b.loss_mask[r], np.arange(1, width) < filled)
            np.testing.assert_array_equal(b.positions[r][filled:], 0)
            saw_padding |= filled < width
            for n, s in enumerate(segments):
                length = len(ws.sources[0].read([s.document])[0])
                if length <= width:
                    assert (s.start, s.stop) == (0, length), "a document that fits in a row was split"
                else:
                    saw_split = True
                    # a long document fills rows from their start; only its last piece shares a row
                    assert n == 0 or s.start == 0
                    assert s.stop == length or (n == len(segments) - 1 and filled == width)
    assert saw_padding and saw_split


def test_pad_mode_row_gets_next_document_only_if_it_fits():
    docs = [[encode_token(0, d, j) for j in range(n)] for d, n in enumerate([3, 4, 2, 6])]
    ws = StaticMixture([MemorySource(docs)], chunk_size=4, shuffle=False)
    b = take(token_pipeline(ws, seq_len=7, batch_size=3, mode="pad", pad_id=-1), 1)[0]
    # rows of 8: [3+4, pad], [2+6], [3+4 of the next chunk ...]
    assert [[(s.document, s.start, s.stop) for s in row] for row in b.provenance] == [
        [(0, 0, 3), (1, 0, 4)],
        [(2, 0, 2), (3, 0, 6)],
        [(0, 0, 3), (1, 0, 4)],
    ]
    assert b.loss_mask[0].tolist() == [True] * 6 + [False]
    assert b.loss_mask[1].all()


# -- tokenize ---------------------------------------------------------------------
def test_tokenize_adds_bos_and_eos_and_parallelism_does_not_change_data():
    ws = StaticMixture([MemorySource(text_docs(60), name="t")], seed=2, chunk_size=8)
    tok = CharTokenizer()

    def build(par, **opts):
        return Pipeline(ws).tokenize(tok, bos_id=1, eos_id=2, parallelism=par).pack(12).batch(2).options(**opts)

    ref = take(build(1, prefetch=0, reader_threads=0), 6)
    for b in ref:
        for r, segments in enumerate(b.provenance):
            parts = [np.array([1] + tok.encode(ws.sources[0].read([s.document])[0]) + [2])[s.start : s.stop] for s in segments]
            np.testing.assert_array_equal(_row_tokens(b, r), np.concatenate(parts))
    with build(3, prefetch=3, reader_threads=2, readahead=3) as p:
        assert digests(take(p, 6)) == digests(ref)


def test_tokenize_with_a_tokenizers_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{c: i + 1 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz0123456789:")}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    ws = StaticMixture([MemorySource(text_docs(30), name="t")], seed=2, chunk_size=4)
    b = take(Pipeline(ws).tokenize(tok).pack(8).batch(1).options(prefetch=0), 1)[0]
    first = b.provenance[0][0]
    text = ws.sources[0].read([first.document])[0]
    assert b.input_ids[0, 0] == vocab[text[first.start]]


# -- batches --------------------------------------------------------------------
def test_digest_is_stable_across_runs_and_content_sensitive():
    a = digests(take(token_pipeline(mixture(seed=1)), 5))
    b = digests(take(token_pipeline(mixture(seed=1), prefetch=3), 5))
    c = digests(take(token_pipeline(mixture(seed=2)), 5))
    assert a == b
    assert len(set(a)) == 5
    assert not set(a) & set(c)


def test_digest_covers_every_array():
    base = take(token_pipeline(mixture(), mode="pad", seq_len=30), 1)[0]

    def variant(**changes):
        fields = dict(
            input_ids=base.input_ids.copy(), labels=base.labels.copy(), positions=base.positions.copy(),
            loss_mask=base.loss_mask.copy(), lane=base.lane, lane_index=base.lane_index,
            cursor=base.cursor, segments=base.segments,
        )
        fields.update(changes)
        return Batch(**fields)

    assert variant().digest == base.digest
    # Lane and cursor are not content: the same rows from another lane or rank are the same batch.
    assert variant(lane=5, lane_index=9, cursor=Cursor(9, 9, 9, 0)).digest == base.digest
    for name in ("input_ids", "labels", "positions"):
        arr = getattr(base, name).copy()
        arr[0, 0] += 1
        assert variant(**{name: arr}).digest != base.digest, name
    mask = base.loss_mask.copy()
    mask[0, -1] = not mask[0, -1]
    assert variant(loss_mask=mask).digest != base.digest
    assert len(base.row_digests()) == len(base)


def test_a_batch_comes_from_one_lane():
    ws = mixture((5000, 3000), [1, 1], chunk_size=4)
    C = 4
    lane_docs = {lane: set(_lane_documents(ws, lane, C, 60)) for lane in range(C)}
    p = token_pipeline(ws, seq_len=10, batch_size=3, dp_degree=1, dp_group_id=0, canonical_replicas=C)
    for b in take(p, 16):
        used = {(s.source, s.document) for row in b.provenance for s in row}
        assert used <= lane_docs[b.lane]
        for other in set(range(C)) - {b.lane}:
            assert not used & lane_docs[other]


def test_delivery_is_round_robin_over_owned_lanes():
    p = token_pipeline(mixture(), dp_degree=2, dp_group_id=1, canonical_replicas=8, prefetch=2)
    with p:
        got = [(b.lane, b.lane_index) for b in take(p, 10)]
    assert got == [(4, 0), (5, 0), (6, 0), (7, 0), (4, 1), (5, 1), (6, 1), (7, 1), (4, 2), (5, 2)]


def test_lane_contents_do_not_depend_on_topology():
    C = 4
    ws = mixture((500,), chunk_size=5)

    def by_lane(G: int) -> dict[tuple[int, int], str]:
        """Each batch's digest by (lane, lane_index): 12 batches on ``G`` groups (one step of the simulation)."""
        out: dict[tuple[int, int], str] = {}
        run_phase(lambda G, g: token_pipeline(ws, seq_len=9, canonical_replicas=C, dp_degree=G, dp_group_id=g),
                  Phase(G, 1), 12, None, on_batch=lambda _, b: out.setdefault((b.lane, b.lane_index), b.digest))
        return out

    reference = by_lane(1)
    assert len(reference) == 12
    for G in (2, 4):
        assert by_lane(G) == reference


def test_peers_of_one_group_produce_identical_batches():
    a = token_pipeline(mixture(), shuffle_window=4, dp_degree=2, dp_group_id=1, prefetch=2)
    b = token_pipeline(mixture(), shuffle_window=4, dp_degree=2, dp_group_id=1, prefetch=0)
    with a:
        assert digests(take(a, 8)) == digests(take(b, 8))


def test_shuffle_permutes_rows_within_windows():
    ws = mixture((500,), chunk_size=5)
    plain = take(token_pipeline(ws, seq_len=8, batch_size=1), 12)
    shuffled = take(token_pipeline(ws, seq_len=8, batch_size=1, shuffle_window=4, shuffle_seed=3), 12)
    plain_rows = [b.row_digests()[0] for b in plain]
    shuffled_rows = [b.row_digests()[0] for b in shuffled]
    assert plain_rows != shuffled_rows
    for w in range(3):  # same rows per window, another order
        assert sorted(plain_rows[4 * w : 4 * w + 4]) == sorted(shuffled_rows[4 * w : 4 * w + 4])
    other_seed = take(token_pipeline(ws, seq_len=8, batch_size=1, shuffle_window=4, shuffle_seed=4), 12)
    assert [b.row_digests()[0] for b in other_seed] != shuffled_rows


def test_finite_curriculum_ends_every_lane():
    ws = mixture((40,), chunk_size=4, exhausted="stop")
    total_tokens = sum(len(d) for d in ws.sources[0].read(range(40)))
    p = token_pipeline(ws, seq_len=5, batch_size=1, canonical_replicas=2, dp_degree=1, dp_group_id=0)
    batches = list(p)
    seen = sum(int(b.loss_mask.sum()) + 1 for b in batches)  # valid labels + first input
    assert seen == total_tokens
    docs = sorted({s.document for b in batches for row in b.provenance for s in row})
    assert docs == list(range(40))


def test_drop_last_false_keeps_the_partial_batch():
    ws = mixture((12,), chunk_size=4, exhausted="stop", lo=5, hi=5)  # 60 tokens -> 10 rows of 6
    full = list(Pipeline(ws).pack(5).batch(4).options(prefetch=0))
    kept = list(Pipeline(ws).pack(5).batch(4, drop_last=False).options(prefetch=0))
    assert [len(b) for b in full] == [4, 4]
    assert [len(b) for b in kept] == [4, 4, 2]


def test_process_runner_gives_the_same_data():
    ws = StaticMixture([MemorySource(text_docs(60), name="t")], seed=2, chunk_size=8)

    def build(**kw):
        return Pipeline(ws).tokenize(CharTokenizer(), eos_id=0, **kw).pack(12).batch(2).options(prefetch=0)

    ref = digests(take(build(), 5))
    with build(parallelism=2, runner="process") as p:
        assert digests(take(p, 5)) == ref


def test_a_curriculum_without_tokens_fails_instead_of_hanging():
    import pytest

    from zephon_core import DataError, MemorySource, Pipeline, StaticMixture

    ws = StaticMixture([MemorySource([[1, 2, 3]] * 50, name="d")], seed=1, chunk_size=4)
    p = Pipeline(ws).filter(lambda d: False).pack(seq_len=4).batch(1).options(prefetch=0)
    with pytest.raises(DataError, match="no tokens in .* consecutive chunks"):
        next(iter(p))
