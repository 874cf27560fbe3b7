"""The vectorised packers against a row-by-row reference packer.

The reference below is the packing contract written as plainly as possible:
take tokens from the document under the packer until the row is full (pad:
until the next document does not fit), then report the packer position. The
real packers receive the same documents cut into arbitrary pieces and must
produce identical rows, positions, masks, provenance and positions after
every row, whether or not the pieces leave room in front for the open row.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core.batch import row_layout
from zephon_core.lane.packing import ConcatPacker, PadPacker, RowBlock
from zephon_core.lane.pieces import Piece

PAD = -1


def reference(chunks: list[list[list[int]]], width: int, mode: str, start: tuple[int, int, int]):
    """Rows as (tokens, positions, valid, segments, end): segments are (chunk, document, start, stop)."""
    pos = start
    rows = []

    def doc_at():
        nonlocal pos
        while True:
            k, i, t = pos
            if k >= len(chunks):
                return None
            if i >= len(chunks[k]):
                pos = (k + 1, 0, 0)
                continue
            if t >= len(chunks[k][i]):
                pos = (k, i + 1, 0)
                continue
            return chunks[k][i]

    while True:
        tokens, positions, segments = [], [], []
        while len(tokens) < width:
            doc = doc_at()
            if doc is None:
                break
            k, i, t = pos
            remaining, space = len(doc) - t, width - len(tokens)
            if remaining <= space:
                take = remaining
            elif mode == "concat" or not tokens:
                take = space
            else:
                break
            tokens += doc[t : t + take]
            positions += list(range(take))
            segments.append((k, i, t, t + take))
            pos = (k, i, t + take) if t + take < len(doc) else (k, i + 1, 0)
        if not tokens:
            return rows
        filled = len(tokens)
        rows.append((tokens + [PAD] * (width - filled), positions + [0] * (width - filled), [True] * filled + [False] * (width - filled), segments, pos))


def pieces_of(chunks: list[list[list[int]]], start: tuple[int, int], cuts: list[int], headroom: int = 0) -> list[Piece]:
    """The documents from ``start`` on, cut into pieces after the given document counts, with ``headroom``
    slots (filled with junk a packer must never deliver) in front of each."""
    docs = [(k, i, d) for k, chunk in enumerate(chunks) for i, d in enumerate(chunk) if (k, i) >= start]
    out, at = [], 0
    for size in cuts + [len(docs)]:
        part = docs[at : at + max(1, size)]
        if not part:
            break
        at += len(part)
        lengths = [len(d) for _, _, d in part]
        out.append(
            Piece(
                chunk=np.array([k for k, _, _ in part], dtype=np.int64),
                index=np.array([i for _, i, _ in part], dtype=np.int64),
                sources=np.array([k for k, _, _ in part], dtype=np.int64),  # source := chunk, document := index, to compare
                documents=np.array([i for _, i, _ in part], dtype=np.int64),
                tokens=np.array([-7] * headroom + [x for _, _, d in part for x in d], dtype=np.int64),
                offsets=headroom + np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                headroom=headroom,
            )
        )
    return out


def run_packer(chunks, width, mode, start, cuts, headroom=0) -> list[tuple]:
    packer = ConcatPacker(width, PAD) if mode == "concat" else PadPacker(width, PAD)
    blocks: list[RowBlock] = []
    t = start[2]
    for n, piece in enumerate(pieces_of(chunks, start[:2], cuts, headroom)):
        block = packer.feed(piece, 0, t if n == 0 else 0)
        if block is not None:
            blocks.append(block)
    last = packer.flush((len(chunks), 0, 0))
    if last is not None:
        blocks.append(last)
    rows = []
    for b in blocks:
        positions, valid = row_layout(b.segments, len(b), b.tokens.shape[1])  # what a batch of these rows reports
        for r in range(len(b)):
            segs = [tuple(s[1:]) for s in b.segments.tolist() if s[0] == r]
            rows.append((b.tokens[r].tolist(), positions[r].tolist(), valid[r].tolist(), segs, tuple(b.ends[r].tolist())))
        assert b.tokens.dtype == np.int64 and positions.dtype == np.int64 and valid.dtype == bool
        assert list(b.segments[:, 0]) == sorted(b.segments[:, 0])  # ordered by row
    return rows



@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    shape=st.lists(st.lists(st.integers(0, 14), max_size=6), min_size=1, max_size=6),
    width=st.integers(1, 11),
    mode=st.sampled_from(["concat", "pad"]),
    data=st.data(),
)
def test_packers_match_the_reference(shape, width, mode, data):
    counter = iter(range(10**6))
    chunks = [[[next(counter) for _ in range(n)] for n in chunk] for chunk in shape]
    starts = [(k, i) for k, chunk in enumerate(chunks) for i in range(len(chunk))]
    if starts and data.draw(st.booleans()):
        k, i = data.draw(st.sampled_from(starts))
        t = data.draw(st.integers(0, len(chunks[k][i])))
    else:
        k, i, t = 0, 0, 0
    cuts = data.draw(st.lists(st.integers(1, 5), max_size=8))
    headroom = data.draw(st.sampled_from([0, width - 1, width + 3]))
    want = reference(chunks, width, mode, (k, i, t))
    got = run_packer(chunks, width, mode, (k, i, t), cuts, headroom)
    assert got == want


def test_row_block_views_permutation_and_join():
    chunks = [[list(range(10 * d, 10 * d + d)) for d in range(1, 8)]]
    block = ConcatPacker(4, PAD).feed(pieces_of(chunks, (0, 0), [])[0], 0, 0)
    assert block is not None and len(block) == 7
    head, tail = block.rows(0, 3), block.rows(3, 7)
    joined = RowBlock.join([head, tail])
    for name in ("tokens", "segments", "ends"):
        assert np.array_equal(getattr(joined, name), getattr(block, name)), name
    order = np.array([6, 0, 3, 1, 5, 2, 4])
    moved = block.permuted(order)
    assert np.array_equal(moved.tokens, block.tokens[order])
    for r, src in enumerate(order):
        assert moved.segments[moved.segments[:, 0] == r, 1:].tolist() == block.segments[block.segments[:, 0] == src, 1:].tolist()
