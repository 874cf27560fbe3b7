"""The journal of a mixture the run steers by its own losses: every decision, as plain JSON.

A decision (``Decision``) is what a mixing controller chose at one optimizer step:
the source weights, quantized to integers over ``DENOMINATOR`` (so they sum to it
exactly and equal inputs give equal stages on every rank and platform), the global
chunk its stage starts at, which controller decided with which parameters, the
per-source figures it decided on (mean loss and loss tokens of the interval, rounded
to ``FIGURE_DIGITS`` significant digits: equal inputs give equal journals) beside a
digest of the exact ones, and the controller's state after it (so a resumed run
continues the same controller). The journal is part of the data definition
(``steered.JournaledMixture``): its fingerprint covers it, a resume replays it
instead of asking the controller again, and a rank whose journal differs from the
leader's is refused when their states are merged (``first_difference``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zephon_core.curriculum.mixture_base import largest_remainder
from zephon_core.errors import StateError

VERSION = 1
DENOMINATOR = 10_000  # weights are integers over this: 0.01 percentage points
FIGURE_DIGITS = 6  # significant digits of a journaled loss: a record to read, the digest holds the exact figures
_DECISION_KEYS = {"step", "start_chunk", "weights", "controller", "params", "inputs", "state", "figures"}
_FIGURE_KEYS = {"mean_loss", "loss_tokens"}
_KEYS = {"version", "denominator", "weight_by", "decisions"}


def quantize(shares: Sequence[float], denominator: int = DENOMINATOR) -> tuple[int, ...]:
    """Integer weights over ``denominator`` proportional to ``shares``, summing to it exactly.

    Hamilton's method with ties broken by position: the same shares give the same integers everywhere.
    """
    if not shares or any(not math.isfinite(s) or s < 0 for s in shares) or not math.fsum(shares) > 0:
        raise ValueError(f"shares must be finite, >= 0 and not all 0, got {list(shares)}")
    return tuple(largest_remainder(list(shares), denominator))


def rounded(x: float | None) -> float | None:
    """``x`` to ``FIGURE_DIGITS`` significant digits (None and non-finite values as None: JSON has no NaN)."""
    return None if x is None or not math.isfinite(x) else float(f"{x:.{FIGURE_DIGITS}g}")


def digest_of(value: Any) -> str:
    """sha256 of the canonical JSON of ``value`` (sorted keys, no NaN)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Decision:
    """One mixing decision: from global chunk ``start_chunk`` on, source ``n`` gets ``weights[n] / DENOMINATOR``.

    ``step`` is the optimizer step after which it was made; ``inputs`` the digest of the figures the
    controller saw (``controllers.MixingInputs.digest``); ``state`` the controller's state after it;
    ``figures`` what it decided on, per source: ``{"mean_loss": {name: loss per token | None},
    "loss_tokens": {name: tokens}}`` of the interval (``controllers.MixingInputs.figures``).
    """

    step: int
    start_chunk: int
    weights: dict[str, int]
    controller: str
    params: dict[str, Any] = field(default_factory=dict)
    inputs: str = ""
    state: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "start_chunk": self.start_chunk, "weights": dict(self.weights),
                "controller": self.controller, "params": dict(self.params), "inputs": self.inputs,
                "state": dict(self.state), "figures": {k: dict(v) for k, v in self.figures.items()}}

    def mean_loss(self, name: str) -> float | None:
        """Source ``name``'s mean loss per token over the interval decided on (None: none of it trained, or
        a decision journaled without figures)."""
        return self.figures.get("mean_loss", {}).get(name)

    def summary(self) -> str:
        """One line: the step, the chunk, the weights as shares."""
        shares = ", ".join(f"{n} {w / DENOMINATOR:.4g}" for n, w in self.weights.items())
        return f"step {self.step} -> chunk {self.start_chunk}: {shares} ({self.controller})"


@dataclass(frozen=True)
class MixingJournal:
    """The decisions of a steered mixture, in order; ``weight_by`` is how their stages weigh sources."""

    decisions: tuple[Decision, ...] = ()
    weight_by: str = "tokens"

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "denominator": DENOMINATOR, "weight_by": self.weight_by,
                "decisions": [d.to_json() for d in self.decisions]}

    def digest(self) -> str:
        return digest_of(self.to_json())

    def appended(self, decision: Decision) -> MixingJournal:
        return MixingJournal((*self.decisions, decision), self.weight_by)

    @staticmethod
    def stage_name(n: int) -> str:
        """The name of decision ``n``'s stage in the curriculum."""
        return f"mix{n}"


def first_difference(a: MixingJournal | None, b: MixingJournal | None) -> str | None:
    """Where journal ``b`` first differs from ``a``, in one phrase; None when they are the same."""
    da, db = (a.decisions if a else ()), (b.decisions if b else ())
    if a is not None and b is not None and a.weight_by != b.weight_by:
        return f"weight_by {a.weight_by!r} vs {b.weight_by!r}"
    for n in range(max(len(da), len(db))):
        x, y = (da[n] if n < len(da) else None), (db[n] if n < len(db) else None)
        if x == y:
            continue
        if x is None or y is None:
            only = x or y
            assert only is not None
            return f"decision {n} ({only.summary()}) is in only one of them"
        return f"decision {n}: {x.summary()} vs {y.summary()}"
    return None


def _fail(where: str, what: str, value: Any) -> StateError:
    return StateError(f"state field {where}: {what}, got {type(value).__name__} {value!r}"[:300])


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(where, "must be an integer >= 0", value)
    return value


def _figures(value: Any, where: str) -> dict[str, dict[str, Any]]:
    """A decision's ``figures``: per-source mean losses (numbers or null) and loss tokens (integers); {} for none."""
    if value == {}:
        return {}
    if not isinstance(value, Mapping) or set(value) != _FIGURE_KEYS or not all(
            isinstance(v, Mapping) for v in value.values()):
        raise _fail(where, f"must be a dict of exactly {', '.join(sorted(_FIGURE_KEYS))}, each by source", value)
    losses = value["mean_loss"]
    if not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in losses.values()):
        raise _fail(f"{where}.mean_loss", "must be numbers or null", losses)
    return {"mean_loss": {str(k): None if v is None else float(v) for k, v in losses.items()},
            "loss_tokens": {str(k): _int(v, f"{where}.loss_tokens") for k, v in value["loss_tokens"].items()}}


def parse_journal(value: Any, where: str = "definition.work_source.journal") -> MixingJournal:
    """A definition's ``journal``, checked; a malformed one raises ``StateError`` naming the field."""
    if not isinstance(value, Mapping) or set(value) != _KEYS:
        raise _fail(where, f"must be a dict of exactly {', '.join(sorted(_KEYS))}", value)
    if value["version"] != VERSION or value["denominator"] != DENOMINATOR:
        raise StateError(f"state field {where}: version {value['version']!r} over {value['denominator']!r} is not "
                         f"supported (this Zephon reads version {VERSION} over {DENOMINATOR}); resume with the Zephon "
                         "that wrote it")
    if value["weight_by"] not in ("documents", "tokens") or not isinstance(value["decisions"], list):
        raise _fail(where, "weight_by must be documents or tokens and decisions a list", dict(value))
    out = []
    for n, d in enumerate(value["decisions"]):
        at = f"{where}.decisions[{n}]"
        if not isinstance(d, Mapping) or set(d) != _DECISION_KEYS:
            raise _fail(at, f"must be a dict of exactly {', '.join(sorted(_DECISION_KEYS))}", d)
        weights = d["weights"]
        if not isinstance(weights, Mapping) or sum(_int(w, f"{at}.weights") for w in weights.values()) != DENOMINATOR:
            raise _fail(f"{at}.weights", f"must be integers summing to {DENOMINATOR}", weights)
        if not all(isinstance(d[k], str) for k in ("controller", "inputs")):
            raise _fail(at, "controller and inputs must be strings", d)
        if not isinstance(d["params"], Mapping) or not isinstance(d["state"], Mapping):
            raise _fail(at, "params and state must be dicts", d)
        out.append(Decision(_int(d["step"], f"{at}.step"), _int(d["start_chunk"], f"{at}.start_chunk"),
                            {str(k): int(w) for k, w in weights.items()}, d["controller"], dict(d["params"]),
                            d["inputs"], dict(d["state"]), _figures(d["figures"], f"{at}.figures")))
    return MixingJournal(tuple(out), value["weight_by"])
