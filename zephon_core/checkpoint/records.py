"""The contents of the protocol's files: encoding, and strict decoding with errors that name the file.

A part or the round file with no valid record for the round being read is "not
(yet) there": fixed names are overwritten at each round, and a crashed writer
may have left anything under them. A part is written in place (one operation,
``AggregateFolder.write``): its header line names the round and the SHA-256 of
the rest, so a write in progress or cut short is "not there" either, never
taken. A whole file that names this round's token but holds something wrong is
an error.

The merged file is a one-line JSON header (token, next round, the SHA-256 of
the rest) followed by the merged state's canonical JSON, so that each of many
readers checks it with one hash instead of re-serialising the state.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from zephon_core.checkpoint.names import is_token
from zephon_core.checkpoint.state import LaneState, canonical_json, parse_lanes, verify_checksum
from zephon_core.checkpoint.tree import Writers
from zephon_core.errors import AggregationError, StateError

PART, MERGED, MOVED, ROUND = "zephon.part", "zephon.merged", "zephon.moved", "zephon.round"


@dataclass(frozen=True)
class Round:
    """A round as ranks know it: its token, its number and who writes."""

    token: str
    number: int
    writers: Writers


def _load(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None


# -- part-<rank>.json ----------------------------------------------------------
@dataclass(frozen=True)
class Part:
    level: int
    first: int
    state: dict[str, Any] | None  # None when ``error`` says why the writer could not merge its node
    lanes: dict[int, LaneState]  # the state's, validated
    strides: dict[str, Any] | None  # while every rank writes: the strides that fit the ranks below
    error: str | None = None
    # With ``error``, when its writer's time ran out: who below it never came (``account.Account.to_json``).
    account: dict[str, Any] | None = None


_PART_KEYS = {"level", "first", "state", "strides", "error", "account"}


def encode_part(rnd: Round, level: int, first: int, state: dict[str, Any] | None, strides: dict[str, Any] | None,
                error: str | None = None, account: dict[str, Any] | None = None) -> bytes:
    """A header line (kind, token, the SHA-256 of the rest) and the part: written in place, a reader takes it only whole."""
    rec = {"level": level, "first": first, "state": state, "strides": strides, "error": error, "account": account}
    body = canonical_json(rec).encode()
    return canonical_json({"kind": PART, "token": rnd.token, "sha256": hashlib.sha256(body).hexdigest()}).encode() + b"\n" + body


def _part_head(data: bytes) -> tuple[Any, bytes, bool]:
    """The header, the body, and whether the body is the one the header names (not a write in progress or cut short)."""
    head, nl, body = data.partition(b"\n")
    rec = _load(head)
    whole = bool(nl) and isinstance(rec, dict) and hashlib.sha256(body).hexdigest() == rec.get("sha256")
    return rec, body, whole


def decode_part(data: bytes | None, where: str, rnd: Round, level: int, first: int) -> Part | None:
    """The part this round expects at ``where``, None while it holds no whole record of this round."""
    if data is None:
        return None
    head, body, whole = _part_head(data)
    if not isinstance(head, dict) or head.get("kind") != PART or head.get("token") != rnd.token or not whole:
        return None
    rec = _load(body)
    if not isinstance(rec, dict) or set(rec) != _PART_KEYS or (rec["level"], rec["first"]) != (level, first):
        raise AggregationError(f"{where}: a part of this round, but not the one expected (level {level}, first slot {first})")
    if rec["error"] is not None:
        account = rec["account"]
        if account is not None and not _is_account(account):
            raise AggregationError(f"{where}: malformed field account {str(account)[:120]!r}")
        return Part(level, first, None, {}, None, str(rec["error"]), account)
    try:
        lanes = parse_lanes(rec["state"])
        verify_checksum(rec["state"])
    except StateError as e:
        raise AggregationError(f"{where}: {e}") from None
    strides = rec["strides"]
    if strides is not None and not (isinstance(strides, dict) and set(strides) == {"groups", "candidates"}
                                    and isinstance(strides["candidates"], list)):
        raise AggregationError(f"{where}: malformed field strides {strides!r}")
    return Part(level, first, rec["state"], lanes, strides)


def _is_account(value: Any) -> bool:
    def ints(xs: Any, n: int | None = None) -> bool:
        return isinstance(xs, list) and (n is None or len(xs) == n) \
            and all(isinstance(x, int) and not isinstance(x, bool) for x in xs)
    return (isinstance(value, dict) and set(value) == {"absent", "stuck", "notes"} and ints(value["absent"])
            and isinstance(value["stuck"], list) and all(ints(x, 2) for x in value["stuck"])
            and isinstance(value["notes"], list) and all(isinstance(x, str) for x in value["notes"]))


def why_not_a_part(data: bytes | None, rnd: Round) -> str:
    """For an error message: what a part file that never became valid held instead."""
    if data is None:
        return "no file"
    head, _, whole = _part_head(data)
    if not isinstance(head, dict):
        return f"{len(data)} bytes that do not start with a JSON header line"
    if head.get("kind") != PART:
        return "JSON that is not a Zephon part (was it written by something else?)"
    if head.get("token") != rnd.token:
        return "a part of an earlier round"
    return "a part of this round" if whole else "an incomplete part of this round (its writer stopped while writing it?)"


# -- merged-<token>.json -------------------------------------------------------
@dataclass(frozen=True)
class Merged:
    state: dict[str, Any]
    following: Round  # the round the leader announced for the next checkpoint
    took: float  # seconds from the leader's call to this file: when ranks that call with it may expect the next one


@dataclass(frozen=True)
class Moved:
    to: Round  # the round that replaced this one


def encode_merged(rnd: Round, state_json: bytes, following: Round, took: float) -> bytes:
    header = {"kind": MERGED, "token": rnd.token, "round": rnd.number, "sha256": hashlib.sha256(state_json).hexdigest(),
              "next": {"token": following.token, "round": following.number, "writers": following.writers.to_json()},
              "took": round(took, 4)}
    return canonical_json(header).encode() + b"\n" + state_json


def encode_moved(token: str, to: Round) -> bytes:
    return canonical_json({"kind": MOVED, "token": token, "to": {"token": to.token, "round": to.number, "writers": to.writers.to_json()}}).encode()


def _round_ref(value: Any, world_size: int, where: str) -> Round:
    if not isinstance(value, dict) or set(value) != {"token", "round", "writers"} or not is_token(value["token"]) \
            or not isinstance(value["round"], int):
        raise AggregationError(f"{where}: malformed round reference {str(value)[:120]!r}")
    return Round(value["token"], value["round"], Writers.from_json(value["writers"], world_size, where))


def decode_merged(data: bytes, where: str, token: str, world_size: int) -> Merged | Moved:
    """A merged file (its name carries a fresh token, so anything wrong in it is an error)."""
    head, _, body = data.partition(b"\n")
    rec = _load(head)
    if not isinstance(rec, dict) or rec.get("kind") not in (MERGED, MOVED) or rec.get("token") != token:
        raise AggregationError(f"{where}: not a Zephon merged state of round {token} (was it written by something else?)")
    if rec["kind"] == MOVED:
        return Moved(_round_ref(rec.get("to"), world_size, where))
    if hashlib.sha256(body).hexdigest() != rec.get("sha256"):
        raise AggregationError(f"{where}: the merged state does not match its checksum: the file was altered or corrupted")
    state = _load(body)
    if not isinstance(state, dict):
        raise AggregationError(f"{where}: the merged state is not a JSON object")
    took = rec.get("took")
    return Merged(state, _round_ref(rec.get("next"), world_size, where), float(took) if isinstance(took, (int, float)) and took >= 0 else 0.0)


# -- round.json ----------------------------------------------------------------
@dataclass(frozen=True)
class RoundFile:
    """The leader's round file. ``took`` (timing only): for a closed round, the seconds the leader
    took in it; for an open one, what the last launch's first round of this world size took, so
    that a launch's ranks know when to look for the merged state of a round nothing else dates."""

    round: Round
    open: bool  # closed: the leader has (or had) every part and publishes (or published) the merged state
    took: float | None = None


def encode_round(rnd: Round, is_open: bool, took: float | None = None) -> bytes:
    rec: dict[str, Any] = {"kind": ROUND, "token": rnd.token, "round": rnd.number, "writers": rnd.writers.to_json(),
                           "status": "open" if is_open else "closed"}
    if took is not None:
        rec["took"] = round(took, 4)
    return canonical_json(rec).encode()


def decode_round(data: bytes | None, world_size: int) -> RoundFile | None:
    """The leader's round file, None when absent or not a valid one (a crash's leftover: the leader rewrites it)."""
    rec = _load(data) if data is not None else None
    if not isinstance(rec, dict) or rec.get("kind") != ROUND or rec.get("status") not in ("open", "closed"):
        return None
    try:
        rnd = _round_ref({k: rec.get(k) for k in ("token", "round", "writers")}, world_size, "round.json")
    except AggregationError:
        return None
    took = rec.get("took")
    if not (isinstance(took, (int, float)) and not isinstance(took, bool) and 0 <= took < float("inf")):
        took = None  # timing only: a figure that is not one is ignored
    return RoundFile(rnd, rec["status"] == "open", None if took is None else float(took))
