"""The checkpoint state: schema, strict validation, merging and diffs.

A state is plain JSON data (no pickle, nothing executable):

    {"format": "zephon.state", "version": 1,
     "fingerprint": sha256 of the canonical JSON of "definition",
     "definition": {...everything that defines the data...},
     "canonical_replicas": C,
     "topology": {"dp_degree": G, "world_size": W, ...},
     "lanes": {"<lane>": {"cursor": [chunk, document, token, delivered_in_window],
                          "delivered": batches delivered}},
     "checksum": sha256 of the canonical JSON of all the other fields}

A per-group state holds the lanes that group owns; merging states takes the
union of their lanes, and a merged state restores on any topology.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from zephon_core.batch import Cursor
from zephon_core.errors import StateError

FORMAT = "zephon.state"
VERSION = 1
_TOP_KEYS = {"format", "version", "fingerprint", "definition", "canonical_replicas", "topology", "lanes", "checksum"}


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def fingerprint_of(definition: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(definition).encode()).hexdigest()


def checksum_of(state: Mapping[str, Any]) -> str:
    """Covers every field, so a flipped bit in a cursor is caught, not restored."""
    return hashlib.sha256(canonical_json({k: v for k, v in state.items() if k != "checksum"}).encode()).hexdigest()


@dataclass(frozen=True)
class LaneState:
    cursor: Cursor
    delivered: int


def _int(value: Any, where: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise StateError(f"state field {where} must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise StateError(f"state field {where} must be >= {minimum}, got {value}")
    return value


def parse_lanes(state: Mapping[str, Any]) -> dict[int, LaneState]:
    """Validate a whole state and return its lanes; every problem names its field."""
    if not isinstance(state, Mapping):
        raise StateError(f"a checkpoint state must be a dict, got {type(state).__name__}")
    missing = sorted(_TOP_KEYS - state.keys())
    if missing:
        raise StateError(f"state is missing field(s): {', '.join(missing)}")
    extra = sorted(set(state.keys()) - _TOP_KEYS)
    if extra:
        raise StateError(f"state has unknown field(s): {', '.join(map(str, extra))}")
    if state["format"] != FORMAT:
        raise StateError(f"state field format must be {FORMAT!r}, got {state['format']!r}")
    if state["version"] != VERSION:
        raise StateError(f"state field version {state['version']!r} is not supported (this Zephon reads version {VERSION})")
    if not isinstance(state["definition"], Mapping):
        raise StateError("state field definition must be a dict")
    if not isinstance(state["fingerprint"], str) or state["fingerprint"] != fingerprint_of(state["definition"]):
        raise StateError("state field fingerprint does not match its definition: the state was altered or corrupted")
    C = _int(state["canonical_replicas"], "canonical_replicas", 1)
    if not isinstance(state["topology"], Mapping):
        raise StateError("state field topology must be a dict")
    lanes_raw = state["lanes"]
    if not isinstance(lanes_raw, Mapping):
        raise StateError("state field lanes must be a dict")
    lanes: dict[int, LaneState] = {}
    for key, value in lanes_raw.items():
        where = f"lanes[{key!r}]"
        if not isinstance(key, str) or not key.isdigit() or int(key) >= C:
            raise StateError(f"state field {where}: lane must be a number below canonical_replicas={C}")
        if not isinstance(value, Mapping) or set(value.keys()) != {"cursor", "delivered"}:
            raise StateError(f"state field {where} must have exactly the fields cursor and delivered")
        cur = value["cursor"]
        if not isinstance(cur, list) or len(cur) != 4:
            raise StateError(f"state field {where}.cursor must be a list of 4 integers")
        cursor = Cursor(*(_int(c, f"{where}.cursor[{n}]") for n, c in enumerate(cur)))
        lanes[int(key)] = LaneState(cursor, _int(value["delivered"], f"{where}.delivered"))
    return lanes


def verify_checksum(state: Mapping[str, Any]) -> None:
    """Refuse a structurally valid state whose content was altered (a flipped bit, an edit).

    Called after the field-by-field checks, so a malformed state is reported
    by the field at fault and only a silent change of value ends up here.
    """
    try:
        intact = state["checksum"] == checksum_of(state)
    except (TypeError, ValueError):  # not JSON data at all
        intact = False
    if not intact:
        raise StateError("state field checksum does not match its content: the state was altered or corrupted")


def make_state(definition: Mapping[str, Any], C: int, topology: Mapping[str, Any], lanes: Mapping[int, LaneState]) -> dict[str, Any]:
    state = {
        "format": FORMAT,
        "version": VERSION,
        "fingerprint": fingerprint_of(definition),
        "definition": json.loads(canonical_json(definition)),
        "canonical_replicas": C,
        "topology": dict(topology),
        "lanes": {str(lane): {"cursor": list(ls.cursor), "delivered": ls.delivered} for lane, ls in sorted(lanes.items())},
    }
    state["checksum"] = checksum_of(state)
    return state


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
    first = states[0]
    parse_lanes(first)
    merged: dict[int, LaneState] = {}
    owner: dict[int, int] = {}
    for n, st in enumerate(states):
        lanes = parse_lanes(st)
        verify_checksum(st)
        if st["fingerprint"] != first["fingerprint"]:
            raise StateError(f"{names[n]} has a different data definition than {names[0]}: {'; '.join(diff_definitions(first['definition'], st['definition'])[:3])}")
        if st["canonical_replicas"] != first["canonical_replicas"]:
            raise StateError(f"{names[n]} has canonical_replicas={st['canonical_replicas']}, {names[0]} has {first['canonical_replicas']}")
        for lane, ls in lanes.items():
            if lane in merged and merged[lane] != ls:
                raise StateError(
                    f"lane {lane} differs between {names[owner[lane]]} ({tuple(merged[lane].cursor)}, {merged[lane].delivered} delivered) "
                    f"and {names[n]} ({tuple(ls.cursor)}, {ls.delivered} delivered): ranks did not checkpoint at the same step"
                )
            merged[lane] = ls
            owner.setdefault(lane, n)
    degrees = [st["topology"].get("dp_degree") for st in states if isinstance(st["topology"].get("dp_degree"), int)]
    topo = {"dp_degree": max(degrees) if degrees else None, "world_size": world_size or first["topology"].get("world_size")}
    return make_state(first["definition"], first["canonical_replicas"], topo, merged)


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
        return out
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]
