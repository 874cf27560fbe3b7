"""The arithmetic of the aggregation protocol (zephon_core/checkpoint/tree.py), checked over many shapes.

Who writes and who merges what is decided by every rank alone, from numbers it
knows; these properties are what makes those independent decisions add up to a
merge of every rank exactly once, with a bounded load on each writer.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core.checkpoint.tree import Tree, Writers, divisors, strides_of

examples = settings(max_examples=300, deadline=None)


@examples
@given(slots=st.integers(1, 3000), fan_in=st.integers(2, 20))
def test_every_writer_is_merged_exactly_once_by_a_writer_above_it(slots, fan_in):
    tree = Tree(slots, fan_in)
    D = tree.depth
    assert fan_in ** D >= slots and (D == 0 or fan_in ** (D - 1) < slots)
    assert tree.top(0) == D
    read_by: dict[int, list[tuple[int, int]]] = {}
    for owner in range(slots):
        for level in range(1, tree.top(owner) + 1):
            kids = tree.children(level, owner)
            assert len(kids) <= fan_in - 1
            for k in kids:
                read_by.setdefault(k, []).append((level, owner))
                assert tree.top(k) == level - 1, "a writer writes the node it owns highest, which its parent reads at that level"
    assert sorted(read_by) == list(range(1, slots)), "every writer but the leader's part is read"
    assert all(len(v) == 1 for v in read_by.values()), "and by exactly one writer"

    def covered(level: int, first: int) -> list[int]:
        if level == 0:
            return [first]
        return covered(level - 1, first) + [s for k in tree.children(level, first) for s in covered(level - 1, k)]

    assert sorted(covered(D, 0)) == list(range(slots))
    assert all(list(tree.span(tree.top(s), s)) == sorted(covered(tree.top(s), s)) for s in range(0, slots, max(1, slots // 50)))


@examples
@given(slots=st.integers(1, 100000), fan_in=st.integers(2, 64))
def test_no_writer_reads_more_than_fan_in_minus_one_parts_per_level(slots, fan_in):
    tree = Tree(slots, fan_in)
    for s in {0, 1, fan_in, slots - 1, (slots // fan_in) * fan_in % slots}:
        reads = sum(len(tree.children(level, s)) for level in range(1, tree.top(s) + 1))
        assert reads <= (fan_in - 1) * tree.top(s) <= (fan_in - 1) * tree.depth


def mesh_layout(pp: int, dp: int, cp: int, tp: int) -> list[int]:
    """dp group of each global rank, TorchTitan's mesh order (pp, dp, cp, tp), tp innermost."""
    return [(r // (cp * tp)) % dp for r in range(pp * dp * cp * tp)]


def chosen_stride(groups_of: list[int], dp: int) -> int | None:
    """What the leader announces: a stride that fits every rank (largest), or none."""
    W = len(groups_of)
    common = set(divisors(W // dp)) if W % dp == 0 else set()
    for r, g in enumerate(groups_of):
        common &= set(strides_of(r, g, dp, W))
    return max(common) if common else None


@examples
@given(pp=st.integers(1, 6), dp=st.integers(1, 12), cp=st.integers(1, 3), tp=st.integers(1, 8))
def test_mesh_layouts_get_one_representative_per_group_the_lowest_rank(pp, dp, cp, tp):
    groups_of = mesh_layout(pp, dp, cp, tp)
    stride = chosen_stride(groups_of, dp)
    assert stride is not None
    w = Writers(len(groups_of), dp, stride)
    reps = [r for r in range(len(groups_of)) if w.slot_of(r) is not None]
    assert [groups_of[r] for r in reps] == list(range(dp)), "exactly one writer per group, slot = group"
    assert all(w.rank_of(w.slot_of(r)) == r for r in reps)  # type: ignore[arg-type]
    if dp > 1:  # the lowest rank of its group (a single group is represented by rank 0 whatever the stride)
        assert reps == [min(r for r in range(len(groups_of)) if groups_of[r] == g) for g in range(dp)]


@examples
@given(dp=st.integers(1, 8), per=st.integers(1, 6), seed=st.integers(0, 10**6))
def test_any_layout_gets_either_a_sound_stride_or_every_rank_writing(dp, per, seed):
    """Shuffled layouts (groups of equal size in any order): a stride is announced only when it is right for every rank."""
    groups_of = [g for g in range(dp) for _ in range(per)]
    random.Random(seed).shuffle(groups_of)
    stride = chosen_stride(groups_of, dp)
    if stride is None:
        return
    w = Writers(len(groups_of), dp, stride)
    for g in range(dp):
        assert groups_of[w.rank_of(g)] == g, f"the representative of group {g} is not in it"
    assert sorted(w.slot_of(r) for r in range(len(groups_of)) if w.slot_of(r) is not None) == list(range(dp))  # type: ignore[type-var]


def test_writers_round_trip_through_json_and_refuse_other_worlds():
    import pytest

    from zephon_core import AggregationError

    w = Writers(16, 4, 4)
    assert Writers.from_json(w.to_json(), 16, "x") == w
    assert Writers.from_json(Writers(16, 4).to_json(), 16, "x").slots == 16
    for bad in ({"world_size": 8, "groups": 4, "stride": 2}, {"world_size": 16, "groups": 4, "stride": 5}, {"world_size": 16}, None):
        with pytest.raises(AggregationError, match="x: names writers"):
            Writers.from_json(bad, 16, "x")
