"""Which lanes a data-parallel group owns, and the order it delivers them in."""

from __future__ import annotations


def owned_lanes(canonical_replicas: int, dp_degree: int, dp_group_id: int) -> list[int]:
    """Contiguous blocks: group ``i`` of ``G`` owns lanes ``[i*C/G, (i+1)*C/G)``.

    When ``G`` does not divide ``C`` the first ``C % G`` groups own one extra
    lane (the pipeline warns about that imbalance).
    """
    base, extra = divmod(canonical_replicas, dp_degree)
    start = dp_group_id * base + min(dp_group_id, extra)
    return list(range(start, start + base + (1 if dp_group_id < extra else 0)))


def next_lane(lanes: list[int], delivered: dict[int, int], live: set[int]) -> int | None:
    """The lane whose batch comes next: fewest delivered, then lowest number.

    Within a group this is exactly round robin in lane order, and it is
    derived from per-lane counts alone, so it needs no pointer in the
    checkpoint and survives a change of topology.
    """
    candidates = [lane for lane in lanes if lane in live]
    if not candidates:
        return None
    return min(candidates, key=lambda lane: (delivered[lane], lane))
