"""zephon_core.lane.assignment: which lanes a data-parallel group owns and delivers."""

from __future__ import annotations

import pytest

from zephon_core import owned_lanes
from zephon_core.lane.assignment import next_lane


@pytest.mark.parametrize("C", range(1, 17))
def test_blocks_cover_every_lane_exactly_once(C):
    for G in range(1, C + 1):
        blocks = [owned_lanes(C, G, g) for g in range(G)]
        flat = [lane for b in blocks for lane in b]
        assert flat == list(range(C)), (C, G)  # contiguous, in group order, no overlap
        sizes = [len(b) for b in blocks]
        assert all(s >= 1 for s in sizes)
        assert max(sizes) - min(sizes) <= 1
        for b in blocks:
            assert b == list(range(b[0], b[0] + len(b)))
        if C % G == 0:
            assert sizes == [C // G] * G


def test_examples_from_the_spec():
    assert [owned_lanes(8, 8, g) for g in range(8)] == [[g] for g in range(8)]
    assert [owned_lanes(8, 4, g) for g in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert owned_lanes(8, 1, 0) == list(range(8))


def test_uneven_split_gives_the_first_groups_one_more():
    assert [owned_lanes(8, 3, g) for g in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [owned_lanes(10, 4, g) for g in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert [owned_lanes(5, 5, g) for g in range(5)] == [[0], [1], [2], [3], [4]]


def test_next_lane_is_round_robin_in_lane_order():
    lanes = [4, 5, 6]
    delivered = {4: 0, 5: 0, 6: 0}
    order = []
    for _ in range(7):
        lane = next_lane(lanes, delivered, set(lanes))
        order.append(lane)
        delivered[lane] += 1
    assert order == [4, 5, 6, 4, 5, 6, 4]


def test_next_lane_resumes_from_counts_and_skips_ended_lanes():
    # A state merged from a larger topology: lane 0 is one batch ahead.
    assert next_lane([0, 1, 2, 3], {0: 3, 1: 2, 2: 2, 3: 2}, {0, 1, 2, 3}) == 1
    assert next_lane([0, 1], {0: 5, 1: 1}, {0}) == 0
    assert next_lane([0, 1], {0: 5, 1: 1}, set()) is None
