"""Merging per-group checkpoint states into one, and explaining how two definitions differ."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from zephon_core.checkpoint.state import LaneState, make_state, parse_lanes, verify_checksum
from zephon_core.checkpoint.steering import same_clock
from zephon_core.checkpoint.surgery import surgery_journal_of
from zephon_core.curriculum.definition import parse_definition
from zephon_core.curriculum.journal import first_difference
from zephon_core.errors import StateError


def merge_states(
    states: Iterable[Mapping[str, Any]], *, world_size: int | None = None, labels: Iterable[str] | None = None
) -> dict[str, Any]:
    """Union the lanes of per-group states of one run into one state.

    States that carry the same lane (data-parallel peers) must agree on it
    exactly; otherwise they were not taken at the same step. ``labels`` name
    the states in error messages (default ``state 0``, ``state 1``, ...).
    """
    states = list(states)
    if not states:
        raise StateError("nothing to merge")
    names = list(labels) if labels is not None else [f"state {n}" for n in range(len(states))]
    parsed = []
    for st in states:
        parsed.append(parse_lanes(st))
        verify_checksum(st)
    return merge_parsed(states, parsed, world_size=world_size, labels=names)[0]


def merge_parsed(
    states: Sequence[Mapping[str, Any]], lanes_of: Sequence[dict[int, LaneState]], *, world_size: int | None, labels: Sequence[str]
) -> tuple[dict[str, Any], dict[int, LaneState]]:
    """``merge_states`` of states already validated (``parse_lanes``, ``verify_checksum``); ``lanes_of`` are their lanes.

    Returns the merged state and its lanes (the aggregation merges level by level).
    """
    first = states[0]
    surgery = surgery_journal_of(first)
    merged: dict[int, LaneState] = {}
    owner: dict[int, int] = {}
    for n, (st, lanes) in enumerate(zip(states, lanes_of)):
        if st["fingerprint"] != first["fingerprint"]:
            _check_journal(first["definition"], st["definition"], labels[0], labels[n])
            raise StateError(f"{labels[n]} has a different data definition than {labels[0]}: {'; '.join(diff_definitions(first['definition'], st['definition'])[:3])}")
        if st["canonical_replicas"] != first["canonical_replicas"]:
            raise StateError(f"{labels[n]} has canonical_replicas={st['canonical_replicas']}, {labels[0]} has {first['canonical_replicas']}")
        if surgery_journal_of(st) != surgery:
            raise StateError(f"{labels[n]} has another surgery journal than {labels[0]} (steps skipped): "
                             "every rank must be told the same skip before the same step")
        for lane, ls in lanes.items():
            if lane in merged and merged[lane] != ls:
                raise StateError(
                    f"lane {lane} differs between {labels[owner[lane]]} ({tuple(merged[lane].cursor)}, {merged[lane].delivered} delivered) "
                    f"and {labels[n]} ({tuple(ls.cursor)}, {ls.delivered} delivered): ranks did not checkpoint at the same step"
                )
            merged[lane] = ls
            owner.setdefault(lane, n)
    degrees = [st["topology"].get("dp_degree") for st in states if isinstance(st["topology"].get("dp_degree"), int)]
    topo = {"dp_degree": max(degrees) if degrees else None, "world_size": world_size or first["topology"].get("world_size")}
    clock = same_clock(states, labels)
    return make_state(first["definition"], first["canonical_replicas"], topo, merged, surgery, clock), merged


def _check_journal(leader: Mapping[str, Any], other: Mapping[str, Any], leader_label: str, label: str) -> None:
    """Refuse a state whose mixing journal differs from the leader's, naming the first differing decision."""
    a, b = parse_definition(leader).journal, parse_definition(other).journal
    if a is None and b is None:
        return
    differs = first_difference(a, b)
    if differs is not None:
        raise StateError(f"{label} decided the steered mixture differently from {leader_label}: {differs} "
                         f"(journal digests {a.digest()[:12] if a else 'none'} vs {b.digest()[:12] if b else 'none'}); "
                         "every rank must decide on the same reduced figures")


def diff_definitions(a: Any, b: Any, path: str = "") -> list[str]:
    """Human-readable differences between two definitions (or any JSON values)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in a:
                out.append(f"{p}: only in the second ({b[k]!r})")
            elif k not in b:
                out.append(f"{p}: only in the first ({a[k]!r})")
            else:
                out.extend(diff_definitions(a[k], b[k], p))
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = []
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} entries vs {len(b)}")
        for n, (x, y) in enumerate(zip(a, b)):
            out.extend(diff_definitions(x, y, f"{path}[{n}]"))
        for n in range(min(len(a), len(b)), max(len(a), len(b))):
            out.append(f"{path}[{n}]: only in the {'first' if n < len(a) else 'second'} ({(a if n < len(a) else b)[n]!r})")
        return out
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]
