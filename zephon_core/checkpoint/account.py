"""Who never came when a round's time ran out: the account a merging writer publishes and the leader reports.

A writer owns the nodes of the tree that start at its slot and writes only the
highest, so nobody else can see below its lower nodes: the leader, looking down
the tree, would find that writer's part missing and nothing wrong below it. So a
merging writer stops waiting before the leader does (``deadline``: one relay per
level between its highest node and the top), examines its own subtree as the
leader would, and publishes the account (the writers that never wrote, the merging
writers that never finished) in its error part. A writer above joins the accounts
of its children to its own, and the leader names the ranks themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zephon_core.checkpoint.folder import AggregateFolder
from zephon_core.checkpoint.names import part_file
from zephon_core.checkpoint.records import Round, decode_part, why_not_a_part
from zephon_core.checkpoint.tree import Tree, Writers
from zephon_core.errors import AggregationError

#: Seconds a relay may take: a writer's error part written, and read by the writer above (which
#: looks at least every ``Pacing.merge_max_s``). Bounded by a share of the timeout (see ``deadline``).
RELAY_S = {True: 0.25, False: 1.0}


@dataclass(frozen=True)
class Member:
    """What a rank knows of itself for the whole run: its folder and its coordination identity."""

    folder: AggregateFolder
    rank: int
    world_size: int
    timeout_s: float
    fan_in: int

    def tree(self, writers: Writers) -> Tree:
        return Tree(writers.slots, self.fan_in)


@dataclass
class Account:
    """Slots of writers that never wrote, nodes ``(level, first slot)`` whose writer never finished, notes."""

    absent: list[int] = field(default_factory=list)
    stuck: list[tuple[int, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def join(self, other: Account) -> Account:
        return Account(sorted({*self.absent, *other.absent}), sorted({*self.stuck, *other.stuck}),
                       self.notes + [n for n in other.notes if n not in self.notes])

    def to_json(self) -> dict[str, Any]:
        return {"absent": self.absent, "stuck": [list(s) for s in self.stuck], "notes": self.notes}

    @staticmethod
    def from_json(value: dict[str, Any]) -> Account:  # validated by records.decode_part
        return Account(list(value["absent"]), [(lv, c) for lv, c in value["stuck"]], list(value["notes"]))


class PartsMissing(Exception):
    """The deadline passed before the parts of ``slots`` (children at ``level``) came; ``accounts``: of
    children that gave up before it, each naming who never came below them."""

    def __init__(self, level: int, slots: list[int], seen: dict[int, bytes | None], accounts: list[Account]) -> None:
        super().__init__(level, slots)
        self.level, self.slots, self.seen, self.accounts = level, slots, seen, accounts


def deadline(me: Member, tree: Tree, top: int, leaders: float) -> float:
    """When a writer whose highest node is at level ``top`` stops waiting, given the leader's deadline
    (as this rank reckons it): one relay per level above it, so that its account reaches the leader in time."""
    if tree.depth == 0:
        return leaders
    relay = min(max(RELAY_S[me.folder.local], me.timeout_s / 20), me.timeout_s / (2 * tree.depth))
    return leaders - (tree.depth - top) * relay


def span_label(writers: Writers, level: int, first: int, slots: int, fan_in: int) -> str:
    if level == 0:
        return writers.who(first)
    last = min(first + fan_in**level, slots) - 1
    if writers.stride is None:
        return f"global ranks {first}-{last}"
    return f"the representatives of dp groups {first}-{last}"


def examine(me: Member, rnd: Round, missing: PartsMissing, root: int, top: int, budget: int = 4096) -> Account:
    """Which writers below node ``(top, root)`` never wrote, which merging writers never finished.

    ``missing`` is what the writer of ``root`` waited for when its time ran out; the
    nodes of the levels above (up to ``top``), which it had not looked at yet, are
    examined too, and the accounts its children published are joined in.
    """
    tree, w, d = me.tree(rnd.writers), rnd.writers, me.folder
    acc = Account()
    later = [(level - 1, c) for level in range(missing.level + 2, top + 1) for c in tree.children(level, root)]
    # On a folder a writer looks at one missing part at a time: those behind the first never looked at are read now.
    unseen = [(missing.level, c) for c in missing.slots if c not in missing.seen]
    blobs = d.get_many([part_file(w.rank_of(c)) for _, c in unseen + later])
    seen = {**missing.seen, **{c: blobs.get(part_file(w.rank_of(c))) for _, c in unseen + later}}
    lv0 = missing.level
    frontier = [(lv0, c) for c in missing.slots if c in missing.seen or _no_part(seen[c], d, rnd, lv0, c)]
    frontier += [(lv, c) for lv, c in later if _no_part(seen[c], d, rnd, lv, c)]
    for lv, c in unseen + later:  # children that gave up after the writer last looked at them
        acc = acc.join(account_of(seen[c], d, rnd, lv, c) or Account())
    while frontier:
        for _, c in frontier:
            why = why_not_a_part(seen.get(c), rnd)
            if why not in ("no file", "a part of an earlier round"):
                acc.notes.append(f"{part_file(w.rank_of(c))} held {why}")
        acc.absent += [c for level, c in frontier if level == 0]
        inner = [(level, c) for level, c in frontier if level > 0]
        kids = [(level - 1, k, c) for level, c in inner for k in tree.children(level, c)]
        if len(kids) > budget:
            acc.notes.append(f"the ranks below {', '.join(w.who(c) for _, c in inner)} were not examined")
            break
        budget -= len(kids)
        blobs = d.get_many([part_file(w.rank_of(k)) for _, k, _ in kids])
        seen = {k: blobs.get(part_file(w.rank_of(k))) for _, k, _ in kids}
        lacking = {(lv, k, c) for lv, k, c in kids if _no_part(seen[k], d, rnd, lv, k)}
        gave_up = [(c, a) for lv, k, c in kids if (a := account_of(seen[k], d, rnd, lv, k)) is not None]
        for _, a in gave_up:
            acc = acc.join(a)
        failed = {p for _, _, p in lacking} | {p for p, _ in gave_up}
        acc.stuck += [(level, c) for level, c in inner if c not in failed]
        frontier = [(lv, k) for lv, k, _ in sorted(lacking)]
    for child in missing.accounts:
        acc = acc.join(child)
    return acc


def describe(me: Member, rnd: Round, acc: Account, head: str) -> str:
    """The error: ``head``, then the ranks that never came and the merging writers that never finished."""
    tree, w = me.tree(rnd.writers), rnd.writers
    parts = [head]
    if acc.absent:
        parts.append(f"{_ranks(w, acc.absent)} of world_size={me.world_size} did not call checkpoint()")
    for level, c in acc.stuck:
        span = span_label(w, level, c, tree.slots, tree.fan_in)
        parts.append(f"{_ranks(w, [c])} (merging the parts of {span}) did not call checkpoint() "
                     "or stopped before writing its part")
    return "; ".join(parts + acc.notes) + "; every pipeline counted in world_size must call it at the same step"


def _no_part(data: bytes | None, d: AggregateFolder, rnd: Round, level: int, slot: int) -> bool:
    try:
        return decode_part(data, d.file(part_file(rnd.writers.rank_of(slot))), rnd, level, slot) is None
    except AggregationError:
        return False  # there, but wrong: its merging writer reports it


def account_of(data: bytes | None, d: AggregateFolder, rnd: Round, level: int, slot: int) -> Account | None:
    """The account in a part whose writer gave up waiting, None for any other (or no) part."""
    try:
        part = decode_part(data, d.file(part_file(rnd.writers.rank_of(slot))), rnd, level, slot)
    except AggregationError:
        return None
    return Account.from_json(part.account) if part is not None and part.account is not None else None


def _ranks(w: Writers, slots: list[int]) -> str:
    ranks = sorted(w.rank_of(c) for c in slots)
    if w.stride is None:
        return f"global rank(s) {ranks}"
    return f"global rank(s) {ranks} (the representative(s) of dp group(s) {sorted(slots)})"
