"""Who writes in a round and how their parts are merged: pure arithmetic, no I/O.

**Writers.** Ranks of one data-parallel group hold identical lanes, so one of
them can stand for all. Ranks are laid out with a *stride* ``I`` when the group
of every global rank ``r`` is ``(r // I) % dp_degree``; then global rank
``g * I`` is the lowest rank of group ``g``, and it is the group's
*representative*. A rank decides from its own numbers whether it writes
(``r == g * I``); the stride is the one the leader saw fit every rank at an
earlier round where every rank wrote. With no such stride every rank writes.

**Tree.** The ``S`` writers are slots ``0 .. S-1`` (the rank itself, or the dp
group). Node ``(L, j)`` covers slots ``j * F**L ..`` (``F`` the fan-in) and is
merged by the writer of its first slot, who also owns the nodes below it that
start there. Each writer writes exactly one file: the merge of the highest node
it owns (just its own state when it owns none); slot 0's is the merged state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zephon_core.errors import AggregationError

FAN_IN = 16


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def strides_of(rank: int, group: int, groups: int, world_size: int) -> list[int]:
    """The strides that place global rank ``rank`` in dp group ``group`` (none when the groups cannot all be the same size)."""
    if groups < 1 or world_size % groups:
        return []
    return [s for s in divisors(world_size // groups) if (rank // s) % groups == group]


@dataclass(frozen=True)
class Writers:
    """The ranks that write in a round: every rank (``stride`` None) or one representative per dp group."""

    world_size: int
    groups: int
    stride: int | None = None

    @property
    def slots(self) -> int:
        return self.world_size if self.stride is None else self.groups

    def rank_of(self, slot: int) -> int:
        return slot if self.stride is None else slot * self.stride

    def slot_of(self, rank: int) -> int | None:
        """This rank's slot, or None when it does not write (another rank of its group does)."""
        if self.stride is None:
            return rank
        slot, rest = divmod(rank, self.stride)
        return slot if rest == 0 and slot < self.groups else None

    def who(self, slot: int) -> str:
        if self.stride is None:
            return f"global rank {slot}"
        return f"global rank {self.rank_of(slot)} (dp group {slot}'s representative)"

    def to_json(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "groups": self.groups, "stride": self.stride}

    @staticmethod
    def from_json(value: Any, world_size: int, where: str) -> Writers:
        ok = isinstance(value, dict) and set(value) == {"world_size", "groups", "stride"}
        if ok:
            w, g, s = value["world_size"], value["groups"], value["stride"]
            ok = w == world_size and isinstance(g, int) and g >= 1 and (s is None or (isinstance(s, int) and s >= 1 and g * s <= w))
        if not ok:
            raise AggregationError(f"{where}: names writers {value!r}, not a round of this world_size={world_size}")
        return Writers(world_size, value["groups"], value["stride"])


@dataclass(frozen=True)
class Tree:
    """The merge tree over ``slots`` writers with fan-in ``fan_in``."""

    slots: int
    fan_in: int = FAN_IN

    @property
    def depth(self) -> int:
        d, span = 0, 1
        while span < self.slots:
            d, span = d + 1, span * self.fan_in
        return d

    def top(self, slot: int) -> int:
        """The highest level whose node this slot's writer merges (0: it merges nothing)."""
        level = 0
        while level < self.depth and slot % (self.fan_in ** (level + 1)) == 0:
            level += 1
        return level

    def children(self, level: int, first: int) -> list[int]:
        """The first slots of node ``(level, first)``'s children other than its own (which starts at ``first``)."""
        step = self.fan_in ** (level - 1)
        return [c for c in range(first + step, min(first + self.fan_in * step, self.slots), step)]

    def span(self, level: int, first: int) -> range:
        return range(first, min(first + self.fan_in**level, self.slots))
