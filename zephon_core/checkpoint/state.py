"""The checkpoint state: its schema and strict validation (merging is in ``merge``).

A state is plain JSON data (no pickle, nothing executable):

    {"format": "zephon.state", "version": 2,
     "fingerprint": sha256 of the canonical JSON of "definition",
     "definition": {...everything that defines the data...},
     "canonical_replicas": C,
     "topology": {"dp_degree": G, "world_size": W, ...},
     "lanes": {"<lane>": {"cursor": [chunk, document, token, delivered_in_window],
                          "delivered": batches delivered,
                          "tally": what the lane delivered (zephon_core.metrics.Tally)}},
     "surgery": {...} (only when the run had surgery: steps skipped; zephon_core.checkpoint.surgery),
     "steering": {...} (only in a steered run's states: the controller's clock; zephon_core.checkpoint.steering),
     "checksum": sha256 of the canonical JSON of all the other fields}

A per-group state holds the lanes that group owns; merging states takes the
union of their lanes, and a merged state restores on any topology.

Version 1 states (no ``tally``) are still read: their lanes count what they
deliver from the restore on (``Tally.since``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zephon_core.batch import Cursor
from zephon_core.checkpoint.steering import FIELD as STEERING
from zephon_core.checkpoint.steering import Clock, clock_of
from zephon_core.checkpoint.surgery import FIELD as SURGERY
from zephon_core.checkpoint.surgery import SurgeryJournal, add_skips, skip_of, surgery_journal_of
from zephon_core.errors import StateError
from zephon_core.metrics import Tally
from zephon_core.validation import require_int

FORMAT = "zephon.state"
VERSION = 2
READS = (1, 2)  # version 1: lanes without a tally
_LANE_KEYS = {1: {"cursor", "delivered"}, 2: {"cursor", "delivered", "tally"}}
_TALLY_COUNTS = ("since", "rows", "padding", "cut")
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
    """One lane's progress: where it stands, how many batches it delivered, and what they held.

    ``tally`` is None for a lane read from a version 1 state (nothing counted yet).
    """

    cursor: Cursor
    delivered: int
    tally: Tally | None = None


def _int(value: Any, where: str, minimum: int = 0) -> int:
    if not isinstance(value, int):  # JSON integers only: a NumPy integer here means the state was not loaded from JSON
        raise StateError(f"state field {where} must be an integer, got {type(value).__name__} {value!r}")
    return require_int(value, f"state field {where}", minimum, error=StateError)


def parse_lanes(state: Mapping[str, Any]) -> dict[int, LaneState]:
    """Validate a whole state and return its lanes; every problem names its field."""
    if not isinstance(state, Mapping):
        raise StateError(f"a checkpoint state must be a dict, got {type(state).__name__}")
    missing = sorted(_TOP_KEYS - state.keys())
    if missing:
        raise StateError(f"state is missing field(s): {', '.join(missing)}")
    extra = sorted(set(state.keys()) - _TOP_KEYS - {SURGERY, STEERING})
    if extra:
        raise StateError(f"state has unknown field(s): {', '.join(map(str, extra))}")
    if state["format"] != FORMAT:
        raise StateError(f"state field format must be {FORMAT!r}, got {state['format']!r}")
    version = state["version"]
    if version not in READS or isinstance(version, bool):
        raise StateError(f"state field version {version!r} is not supported (this Zephon reads versions {', '.join(map(str, READS))})")
    if not isinstance(state["definition"], Mapping):
        raise StateError("state field definition must be a dict")
    if not isinstance(state["fingerprint"], str) or state["fingerprint"] != fingerprint_of(state["definition"]):
        raise StateError("state field fingerprint does not match its definition: the state was altered or corrupted")
    C = _int(state["canonical_replicas"], "canonical_replicas", 1)
    if not isinstance(state["topology"], Mapping):
        raise StateError("state field topology must be a dict")
    surgery_journal_of(state)
    clock_of(state)
    lanes_raw = state["lanes"]
    if not isinstance(lanes_raw, Mapping):
        raise StateError("state field lanes must be a dict")
    lanes: dict[int, LaneState] = {}
    for key, value in lanes_raw.items():
        where = f"lanes[{key!r}]"
        if not isinstance(key, str) or not key.isdigit() or int(key) >= C:
            raise StateError(f"state field {where}: lane must be a number below canonical_replicas={C}")
        keys = _LANE_KEYS[version]
        if not isinstance(value, Mapping) or set(value.keys()) != keys:
            raise StateError(f"state field {where} must have exactly the fields {' and '.join(sorted(keys))}")
        cur = value["cursor"]
        if not isinstance(cur, list) or len(cur) != 4:
            raise StateError(f"state field {where}.cursor must be a list of 4 integers")
        cursor = Cursor(*(_int(c, f"{where}.cursor[{n}]") for n, c in enumerate(cur)))
        tally = _parse_tally(value["tally"], f"{where}.tally") if "tally" in keys else None
        lanes[int(key)] = LaneState(cursor, _int(value["delivered"], f"{where}.delivered"), tally)
    return lanes


def _parse_tally(value: Any, where: str) -> Tally:
    fields = {*_TALLY_COUNTS, "tokens", "documents"}
    if not isinstance(value, Mapping) or set(value.keys()) - {"truncated"} != fields:
        raise StateError(f"state field {where} must have exactly the fields {', '.join(sorted(fields))} (and truncated, if not 0)")
    truncated = _int(value["truncated"], f"{where}.truncated") if "truncated" in value else 0
    since, rows, padding, cut = (_int(value[k], f"{where}.{k}") for k in _TALLY_COUNTS)
    tables = []
    for name in ("tokens", "documents"):
        table = value[name]
        if not isinstance(table, list) or not all(isinstance(row, list) for row in table):
            raise StateError(f"state field {where}.{name} must be a list (per stage) of lists (per source) of integers")
        tables.append([[_int(v, f"{where}.{name}[{i}][{s}]") for s, v in enumerate(row)] for i, row in enumerate(table)])
    if [len(r) for r in tables[0]] != [len(r) for r in tables[1]]:
        raise StateError(f"state field {where}: tokens and documents must have the same shape")
    return Tally(since, rows, padding, cut, tables[0], tables[1], truncated)


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


def make_state(definition: Mapping[str, Any], C: int, topology: Mapping[str, Any], lanes: Mapping[int, LaneState],
               surgery: SurgeryJournal | None = None, clock: Clock | None = None) -> dict[str, Any]:
    """A state of ``lanes``; ``surgery`` (when not empty) is journaled in it and ``clock`` (a steered run's) kept,
    otherwise their fields are absent."""
    state: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "fingerprint": fingerprint_of(definition),
        "definition": json.loads(canonical_json(definition)),
        "canonical_replicas": C,
        "topology": dict(topology),
        "lanes": {
            str(lane): {"cursor": list(ls.cursor), "delivered": ls.delivered, "tally": (ls.tally or Tally(since=ls.delivered)).to_json()}
            for lane, ls in sorted(lanes.items())
        },
    }
    if surgery:
        state[SURGERY] = surgery.to_json()
    if clock is not None:
        state[STEERING] = clock.to_json()
    state["checksum"] = checksum_of(state)
    return state


def skip_in_state(state: Mapping[str, Any], first: int, last: int, batches_per_step: int) -> dict[str, Any]:
    """``state`` with global steps ``first..last`` journaled as skipped (``checkpoint.surgery``); its lanes are
    untouched, so the skip is undone by taking the journal entry out again.

    Refused (StateError) when the state is not intact, or as ``surgery.add_skips`` refuses a skip (one overlapping a
    journaled one, or of steps a lane already delivered); the same skip journaled already leaves the state as it is.
    """
    lanes = parse_lanes(state)
    verify_checksum(state)
    skip = skip_of(first, last, batches_per_step, state["canonical_replicas"])
    return with_surgery(state, add_skips(surgery_journal_of(state), [skip], lanes), lanes)


def with_surgery(state: Mapping[str, Any], journal: SurgeryJournal,
                 lanes: Mapping[int, LaneState] | None = None) -> dict[str, Any]:
    """``state`` (checked) with ``journal`` as its surgery journal and everything else as it was (its lanes,
    ``lanes`` when already parsed, and its steering clock): the one way a state is edited (``zephon skip``,
    ``zephon quarantine``)."""
    return make_state(state["definition"], state["canonical_replicas"], state["topology"],
                      parse_lanes(state) if lanes is None else lanes, journal, clock_of(state))
