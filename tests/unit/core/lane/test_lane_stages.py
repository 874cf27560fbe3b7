"""zephon_core.lane: each stage of a lane on its own (chunks, piece reader, row feed, windows).

The pipeline-level tests check the stages together; these pin each stage's own
contract, so a change to one stage is caught where it is made.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.core_fixtures import CharTokenizer, mixture, text_docs

from zephon_core import Cursor, MemorySource, StateError, StaticMixture, TokenArraySource
from zephon_core.errors import DataError
from zephon_core.lane.chunks import DESCRIPTOR_BATCH, LaneChunks
from zephon_core.lane.docops import DROPPED, DocOpRunner, run_op_on_slice
from zephon_core.lane.feed import RowFeed
from zephon_core.lane.ops import BatchOp, FilterOp, MapOp, PackOp, ShuffleOp, TokenizeOp
from zephon_core.lane.packing import ConcatPacker, PadPacker, Position
from zephon_core.lane.pieces import SLICE_DOCS
from zephon_core.lane.reader import PIECE_DOCS, PieceKey, PieceReader
from zephon_core.lane.stream import LaneStream
from zephon_core.lane.window import InOrder, ShuffleWindow

START = Position(0, 0, 0)


def flat_mixture(n_docs: int = 3000, chunk_size: int = 16, exhausted: str = "repeat") -> StaticMixture:
    """A pretokenized source with ``read_flat``: later pieces span several chunks."""
    lengths = 1 + np.arange(n_docs) % 7
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return StaticMixture([TokenArraySource(np.arange(offsets[-1], dtype=np.int64), offsets)], seed=5, chunk_size=chunk_size, exhausted=exhausted)


def rows_of(feed: RowFeed, n: int) -> list[tuple[int, ...]]:
    out = []
    while len(out) < n:
        block = feed.take(3)
        if block is None:
            break
        out += [tuple(r) for r in block.tokens.tolist()]
    return out


# -- LaneChunks -------------------------------------------------------------------
def test_lane_chunk_k_is_global_chunk_lane_plus_k_times_C():
    ws = mixture((50, 30), chunk_size=4)
    chunks = LaneChunks(ws, lane=2, canonical_replicas=3)
    for k in (0, 1, 7, DESCRIPTOR_BATCH + 5, 3):  # out of order and beyond one batch of descriptors
        got, want = chunks[k], ws.chunk(2 + 3 * k)
        assert got is not None and want is not None and got.index == want.index
        assert np.array_equal(got.sources, want.sources) and np.array_equal(got.documents, want.documents)


def test_lane_chunks_end_with_a_finite_curriculum():
    ws = mixture((20,), chunk_size=4, exhausted="stop")  # 5 chunks
    chunks = LaneChunks(ws, lane=1, canonical_replicas=2)  # global chunks 1, 3, then none
    assert chunks[0] is not None and chunks[1] is not None and chunks[2] is None
    assert chunks.per_epoch == ws.chunks_per_epoch


# -- PieceReader ------------------------------------------------------------------
def test_piece_keys_name_their_fields():
    key = PieceKey(chunk=3, lo=8, hi=16, extra=0)
    assert key == (3, 8, 16, 0) and key.chunk == 3 and key.extra == 0


def test_with_document_operators_the_first_chunk_is_read_in_slices_from_the_restart_document():
    ws = StaticMixture([MemorySource(text_docs(200))], seed=1, chunk_size=40)
    runner = DocOpRunner([TokenizeOp(tokenizer=CharTokenizer())])
    reader = PieceReader(LaneChunks(ws, 0, 1), runner, Position(2, 5, 0), None, 1)
    assert reader.key(2, 5) == PieceKey(2, 5, 5 + SLICE_DOCS, 0)
    assert reader.key(2, 5 + SLICE_DOCS + 1) == PieceKey(2, 5 + SLICE_DOCS, 5 + 2 * SLICE_DOCS, 0)
    assert reader.key(3, 0) == PieceKey(3, 0, 40, 0)  # later chunks whole
    assert reader.key(2, 40) is None  # past the chunk's last document
    assert reader.end_of(PieceKey(3, 0, 40, 0)) == Position(3, 40, 0)


def test_without_operators_flat_sources_read_several_chunks_at_once_but_the_first_alone():
    ws = flat_mixture()
    reader = PieceReader(LaneChunks(ws, 0, 2), DocOpRunner([]), START, None, 1)
    assert reader.key(0, 3) == PieceKey(0, 3, 16, 0)
    later = reader.key(1, 0)
    assert later is not None and later.extra == PIECE_DOCS // 16 - 1
    assert reader.end_of(later) == Position(1 + later.extra, 16, 0)
    piece = reader.read(later)
    assert len(piece.chunk) == PIECE_DOCS and piece.chunk[0] == 1 and piece.chunk[-1] == 1 + later.extra


def test_read_ahead_on_a_pool_gives_the_same_pieces():
    ws = StaticMixture([MemorySource(text_docs(300))], seed=2, chunk_size=24)
    runner = DocOpRunner([TokenizeOp(tokenizer=CharTokenizer())])
    with ThreadPoolExecutor(2) as pool:
        ahead = PieceReader(LaneChunks(ws, 1, 2), runner, START, pool, 3)
        inline = PieceReader(LaneChunks(ws, 1, 2), runner, START, None, 0)
        for k in range(1, 6):
            key = ahead.key(k, 0)
            assert key is not None and key == inline.key(k, 0)
            a, b = ahead.read(key), inline.read(key)
            assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.offsets, b.offsets)
            assert np.array_equal(a.documents, b.documents) and np.array_equal(a.index, b.index)


# -- docops -----------------------------------------------------------------------
def test_a_filtered_document_keeps_its_slot_and_a_map_returning_none_is_refused():
    out = run_op_on_slice(FilterOp(fn=lambda d: d != "b"), ["a", "b", "c"])
    assert out[0] == "a" and out[1] is DROPPED and out[2] == "c"
    assert run_op_on_slice(MapOp(fn=str.upper), out) == ["A", DROPPED, "C"]
    with pytest.raises(DataError, match="returned None.*filter"):
        run_op_on_slice(MapOp(fn=lambda d: None), ["a"])


def test_the_dropped_slot_survives_a_process_pool():
    runner = DocOpRunner([FilterOp(parallelism=2, runner="process", fn=bool)])
    try:
        out = runner.run(["a", "", "b", ""])
    finally:
        runner.close()
    assert out[0] == "a" and out[1] is DROPPED and out[3] is DROPPED


# -- RowFeed ----------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(st.integers(1, 60), st.sampled_from([5, 9, 17]))
def test_a_feed_started_at_a_row_position_hands_out_exactly_the_rows_that_followed(cut, width):
    ws = mixture((80, 40), chunk_size=6)

    def feed(start: Position) -> RowFeed:
        return RowFeed(0, PieceReader(LaneChunks(ws, 0, 2), DocOpRunner([]), start, None, 0), ConcatPacker(width, 0), start)

    whole = feed(START)
    first = whole.take(cut)
    assert first is not None and len(first) == cut
    resumed_at = whole.position
    assert resumed_at == Position.of(first.ends[-1]) and isinstance(resumed_at, Position)
    rest = rows_of(whole, 40)
    assert rows_of(feed(resumed_at), 40) == rest


# -- windows ----------------------------------------------------------------------
def in_order_feed(ws: StaticMixture, start: Position = START) -> RowFeed:
    return RowFeed(0, PieceReader(LaneChunks(ws, 0, 1), DocOpRunner([]), start, None, 0), ConcatPacker(9, 0), start)


def test_in_order_rows_carry_the_feed_position_and_refuse_a_window_cursor():
    ws = mixture((60,), chunk_size=5)
    rows = InOrder(in_order_feed(ws), Cursor.start())
    got = rows.take_run()
    assert got is not None
    block, cursor_after = got
    assert len(block) > 4
    assert [cursor_after(i) for i in range(len(block))] == [Cursor(*Position.of(e), 0) for e in block.ends]
    with pytest.raises(StateError, match="no shuffle"):
        InOrder(in_order_feed(ws), Cursor(0, 0, 0, 2))


def test_a_shuffle_window_permutes_the_rows_of_its_window_and_resumes_inside_it():
    ws = mixture((60,), chunk_size=5)
    op = ShuffleOp(window=6, seed=4)
    plain = [tuple(r) for r in in_order_feed(ws).take(6).tokens.tolist()]
    window = ShuffleWindow(in_order_feed(ws), op, Cursor.start())
    part, cursor_after = window.take_run()
    shuffled = [tuple(r) for r in part.tokens.tolist()]
    assert sorted(shuffled) == sorted(plain) and shuffled != plain
    assert [cursor_after(i) for i in range(5)] == [Cursor(0, 0, 0, i + 1) for i in range(5)]
    end = cursor_after(5)
    assert end.delivered_in_window == 0 and (end.chunk, end.document, end.token) > (0, 0, 0)
    resumed = ShuffleWindow(in_order_feed(ws), op, cursor_after(3))
    again, again_after = resumed.take_run()
    assert [tuple(r) for r in again.tokens.tolist()] == shuffled[4:] and again_after(len(again) - 1) == end
    assert window.take_run().rows.tokens.tolist() != part.tokens.tolist()  # the next window
    with pytest.raises(StateError, match="rows of a window of 6"):
        ShuffleWindow(in_order_feed(ws), op, Cursor(0, 0, 0, 7))


# -- batches ----------------------------------------------------------------------
@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(
    B=st.integers(1, 7), window=st.sampled_from([None, 1, 4, 9]), drop_last=st.booleans(), width=st.integers(2, 9),
    flat=st.booleans(), mode=st.sampled_from(["concat", "pad"]),
)
def test_a_lane_cuts_its_rows_into_batches_in_order_with_the_cursor_after_each(B, window, drop_last, width, flat, mode):
    # Batches are cut many at a time out of runs of rows (a piece, a window), with the rows
    # short of a batch held over: the result must be the rows B at a time, whatever the cuts.
    ws = flat_mixture(150, chunk_size=16, exhausted="stop") if flat else mixture((60, 30), chunk_size=6, exhausted="stop")
    shuffle = None if window is None else ShuffleOp(window, seed=1)

    packer = ConcatPacker(width, 0) if mode == "concat" else PadPacker(width, 0)
    feed = RowFeed(0, PieceReader(LaneChunks(ws, 0, 1), DocOpRunner([]), START, None, 0, packer.headroom), packer, START)
    stage = InOrder(feed, Cursor.start()) if shuffle is None else ShuffleWindow(feed, shuffle, Cursor.start())
    rows = []
    while (run := stage.take_run()) is not None:
        for i in range(len(run.rows)):
            one = run.rows.rows(i, i + 1)
            rows.append((one.tokens[0].tolist(), one.segments[:, 1:].tolist(), run.cursor_after(i)))
    assert rows

    stream = LaneStream(0, 1, ws, DocOpRunner([]), PackOp(width - 1, mode), shuffle, BatchOp(B, drop_last), Cursor.start(), 0)
    got = []
    while (b := stream.next_batch()) is not None:
        got.append(b)
    n_full = len(rows) // B
    assert len(got) == n_full + (0 if drop_last or len(rows) % B == 0 else 1)
    for k, b in enumerate(got):
        want = rows[k * B : (k + 1) * B]
        assert b.lane_index == k and b.cursor == want[-1][2]
        assert np.concatenate([b.input_ids, b.labels[:, -1:]], axis=1).tolist() == [r[0] for r in want]
        assert [[s[1:] for s in b.segments.tolist() if s[0] == r] for r in range(len(b))] == [r[1] for r in want]
