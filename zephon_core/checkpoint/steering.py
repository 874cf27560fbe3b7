"""The steering clock: where a steered mixture's controller stands at a checkpoint, kept in the state.

The mixing journal (``curriculum.journal``, part of the data definition) holds the decisions that changed
the weights. A controller is also asked at every interval whose proposal changes nothing (ODM's first
decisions are uniform), and it learns from each of them (ODM's smoothed rewards, its clock ``t``); the
losses of the interval under way are summed too. None of that is in the journal, so a resume from the
journal alone would count the interval from the last *journaled* decision and start the controller from
the state journaled with it: every later decision would differ from the uninterrupted run's. The clock
keeps what the next decision depends on::

    "steering": {"asked_at": the step the controller was last asked at (0: never),
                 "controller": its name, "state": its state() after that,
                 "loss_sum": [...], "loss_tokens": [...] (the interval under way, per source),
                 "checksum": sha256 of the canonical JSON of the other fields}

It is an optional top-level field of a state, present only in a steered run's states, and no part of the
data's definition: it changes at every step, the data only at a decision. Every rank holds the same clock
(the figures are reduced over the data-parallel groups), so a merge refuses ranks whose clocks differ.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zephon_core.checkpoint.surgery import body_checksum
from zephon_core.errors import StateError

FIELD = "steering"
_KEYS = ("asked_at", "controller", "state", "loss_sum", "loss_tokens")


@dataclass(frozen=True)
class Clock:
    """A steered mixture's controller between two decisions (the module docstring says each field)."""

    asked_at: int
    controller: str
    state: Mapping[str, Any]
    loss_sum: tuple[float, ...]
    loss_tokens: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        body = {"asked_at": self.asked_at, "controller": self.controller, "state": json.loads(json.dumps(self.state)),
                "loss_sum": list(self.loss_sum), "loss_tokens": list(self.loss_tokens)}
        return {**body, "checksum": body_checksum(body)}



def clock_of(state: Mapping[str, Any]) -> Clock | None:
    """The clock of a state (None: not a steered run's, or one written before clocks were kept); a malformed or
    altered clock is a StateError naming the field."""
    raw = state.get(FIELD)
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or set(raw) != {*_KEYS, "checksum"}:
        raise StateError(f"state field {FIELD} must have exactly the fields {', '.join(sorted({*_KEYS, 'checksum'}))}")
    if raw["checksum"] != body_checksum({k: raw[k] for k in _KEYS}):
        raise StateError(f"state field {FIELD}.checksum does not match its content: the clock was altered or corrupted")
    sums, tokens = raw["loss_sum"], raw["loss_tokens"]
    if (type(raw["asked_at"]) is not int or raw["asked_at"] < 0 or not isinstance(raw["controller"], str)
            or not isinstance(raw["state"], Mapping) or not _numbers(sums, float) or not _numbers(tokens, int)
            or len(sums) != len(tokens)):
        raise StateError(f"state field {FIELD} must hold asked_at (a step >= 0), controller (a name), state (a dict) "
                         "and loss_sum / loss_tokens (one finite number per source)")
    return Clock(raw["asked_at"], raw["controller"], dict(raw["state"]), tuple(float(x) for x in sums),
                 tuple(tokens))


def _numbers(values: Any, kind: type) -> bool:
    if not isinstance(values, list):
        return False
    if kind is int:
        return all(type(v) is int and v >= 0 for v in values)
    return all(type(v) in (int, float) and math.isfinite(v) for v in values)


def same_clock(states: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> Clock | None:
    """The one clock of per-rank states of one step (refused, naming the rank, where one differs)."""
    first = clock_of(states[0])
    for st, label in zip(states[1:], labels[1:]):
        other = clock_of(st)
        if other != first:
            raise StateError(f"{label} has another steering clock than {labels[0]} ({_short(other)} vs "
                             f"{_short(first)}): every rank must record the same reduced losses at the same steps")
    return first


def _short(clock: Clock | None) -> str:
    return "none" if clock is None else f"asked at step {clock.asked_at}, {sum(clock.loss_tokens)} loss tokens"
