"""Mixing controllers: what the next source weights are, from the figures of the last interval.

A controller (``MixingController``) is asked every interval with ``MixingInputs``:
figures that are identical on every rank (per-source training loss summed over
the interval and reduced over the data-parallel groups, Zephon's own run-wide
per-source token tallies, the step, the weights in force). It proposes target
shares, or None to keep the weights; ``bounded`` holds the proposal to a minimum
share per source and a maximum change per decision, and ``pipeline.mixing``
quantizes it (``journal.quantize``) and journals it. A controller's state is plain
JSON: it is journaled with every decision, so a resumed run continues the same
controller rather than a fresh one.

Controllers here: ``IdentityController`` (fixed weights), ``ScheduleController``
(step -> weights from a file) and ``OdmController`` (the EXP3 bandit of online
data mixing, Albalak et al. 2023). Each declares its own recipe keys (``keys``) and
builds itself from them (``from_args``, given ``ControllerArgs``); ``controller_registry``
registers them by name, as it does a user's own, and builds one from a ``[mixing]`` table.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from zephon_core.curriculum.journal import digest_of, rounded
from zephon_core.errors import ConfigError
from zephon_core.validation import require_int


@dataclass(frozen=True)
class MixingInputs:
    """What a controller decides on, per source in the curriculum's order (``names``).

    ``loss_sum`` and ``loss_tokens``: the training loss summed over the tokens of each source, and those
    tokens, over the interval and every data-parallel group. ``delivered_tokens``: tokens of each source the
    whole run delivered (Zephon's tallies, summed over groups). ``weights``: the shares in force.
    """

    step: int
    names: tuple[str, ...]
    loss_sum: tuple[float, ...]
    loss_tokens: tuple[int, ...]
    delivered_tokens: tuple[int, ...]
    weights: tuple[float, ...]

    def mean_loss(self) -> list[float | None]:
        """Per source, the mean loss per token over the interval (None: no token of it was trained)."""
        return [s / n if n else None for s, n in zip(self.loss_sum, self.loss_tokens)]

    def figures(self) -> dict[str, dict[str, Any]]:
        """What a decision journals of these figures (``journal.Decision.figures``): per source, the interval's mean
        loss (``journal.rounded``: a function of the figures alone, so equal inputs journal equal numbers) and loss
        tokens."""
        return {"mean_loss": {n: rounded(x) for n, x in zip(self.names, self.mean_loss())},
                "loss_tokens": {n: int(t) for n, t in zip(self.names, self.loss_tokens)}}

    def digest(self) -> str:
        """sha256 of these figures (floats as their shortest repr): equal on ranks that saw equal figures."""
        return digest_of({"step": self.step, "names": list(self.names), "loss_sum": [float(x) for x in self.loss_sum],
                          "loss_tokens": list(self.loss_tokens), "delivered_tokens": list(self.delivered_tokens),
                          "weights": list(self.weights)})


@dataclass(frozen=True)
class ControllerArgs:
    """A controller's own keys of a ``[mixing]`` table (those it declared, as given), for its factory.

    ``where`` is the table's name in messages (``mixing``); ``base`` the folder relative paths are read from
    (the recipe's; None: the working directory).
    """

    keys: Mapping[str, Any]
    where: str = "mixing"
    base: Path | None = None

    def error(self, key: str, message: str) -> ConfigError:
        """The one-line refusal of the key ``key``: ``mixing.KEY: message``."""
        return ConfigError(f"{self.where}.{key}: {message}")

    def path(self, key: str) -> Path:
        """The key ``key`` as a path (a string, relative to ``base``)."""
        value = self.keys.get(key)
        if not isinstance(value, str):
            raise self.error(key, f"must be the path of a file, got {value!r}")
        path = Path(value)
        return path if path.is_absolute() or self.base is None else self.base / path

    def number(self, key: str, default: float) -> float:
        """The key ``key`` as a finite number (``default`` when not given); bools and strings are refused."""
        value = self.keys.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(key, f"must be a finite number, got {value!r}")
        return float(value)


class MixingController(Protocol):
    """Proposes the next weights; ``name`` and ``params()`` are journaled with each decision."""

    name: str

    def params(self) -> dict[str, Any]:
        """The controller's settings, as JSON."""

    def propose(self, inputs: MixingInputs) -> Sequence[float] | None:
        """Target shares per source (any positive scale; normalised after), or None to keep the weights."""

    def state(self) -> dict[str, Any]:
        """Everything ``propose`` remembers between calls, as JSON (journaled after every decision)."""

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Continue from a journaled ``state()``."""


def bounded(current: Sequence[float], target: Sequence[float], min_share: float, max_change: float) -> list[float]:
    """``target`` (normalised) held to ``min_share`` per source and ``max_change`` from ``current`` per source.

    The floor mixes in the uniform share: ``(1 - K m) t + m``, so every source gets at least ``m``; the
    change is the step from ``current`` towards that, shortened until no share moves by more than
    ``max_change``. Both are convex combinations: the result sums to 1 and no source falls below ``m``
    unless it was below it already (it then rises towards it at ``max_change`` per decision).
    """
    k = len(target)
    total = math.fsum(target)
    if k * min_share > 1:
        raise ConfigError(f"mixing.min_share={min_share} times {k} sources is over 1; lower min_share")
    floored = [(1 - k * min_share) * t / total + min_share for t in target]
    largest = max(abs(f - c) for f, c in zip(floored, current))
    step = 1.0 if largest <= max_change else max_change / largest
    return [c + step * (f - c) for f, c in zip(floored, current)]


class IdentityController:
    """Fixed weights: ``weights`` (source name -> weight) at the first decision, then unchanged; None keeps the
    recipe's weights (a run that journals nothing, for comparison)."""

    name = "identity"
    keys: ClassVar[tuple[str, ...]] = ("weights",)

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self.weights = dict(weights) if weights is not None else None

    @classmethod
    def from_args(cls, args: ControllerArgs) -> IdentityController:
        """From ``weights`` (a table of source = weight; not given: the recipe's weights)."""
        weights = args.keys.get("weights")
        if weights is not None and not isinstance(weights, Mapping):
            raise args.error("weights", f"must be a table of source = weight, e.g. {{ web = 0.7, code = 0.3 }}, "
                                        f"got {weights!r}")
        return cls(weights)

    def params(self) -> dict[str, Any]:
        return {"weights": self.weights}

    def propose(self, inputs: MixingInputs) -> Sequence[float] | None:
        return None if self.weights is None else _by_name(self.weights, inputs.names, "identity weights")

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, state: Mapping[str, Any]) -> None:
        pass


class ScheduleController:
    """Weights from a schedule: at each decision, the entry with the largest ``step`` at or before it.

    ``entries`` are ``(step, {source: weight})``; ``from_file`` reads a TOML file of ``[[decisions]]``
    tables with ``step`` and ``weights``.
    """

    name = "schedule"
    keys: ClassVar[tuple[str, ...]] = ("schedule",)

    def __init__(self, entries: Sequence[tuple[int, Mapping[str, float]]], path: str | None = None) -> None:
        # Sorted by step alone, stably: of entries at the same step, the later one holds.
        self.entries = sorted(((require_int(s, "schedule step", 0), dict(w)) for s, w in entries), key=lambda e: e[0])
        self.path = path

    @classmethod
    def from_file(cls, path: str | Path) -> ScheduleController:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"mixing schedule {path}: {e}") from None
        rows = raw.get("decisions")
        if not isinstance(rows, list) or not all(isinstance(r, dict) and set(r) == {"step", "weights"} for r in rows):
            raise ConfigError(f"mixing schedule {path}: needs [[decisions]] tables of step and weights, e.g. "
                              "step = 100 and weights = { web = 0.7, code = 0.3 }")
        return cls([(r["step"], r["weights"]) for r in rows], str(path))

    @classmethod
    def from_args(cls, args: ControllerArgs) -> ScheduleController:
        """From ``schedule``: a TOML file of ``[[decisions]]`` (``from_file``), relative to the recipe."""
        if "schedule" not in args.keys:
            raise args.error("schedule", "controller 'schedule' needs the path of a schedule file")
        return cls.from_file(args.path("schedule"))

    def params(self) -> dict[str, Any]:
        return {"path": self.path, "entries": [[s, w] for s, w in self.entries]}

    def propose(self, inputs: MixingInputs) -> Sequence[float] | None:
        due = [w for s, w in self.entries if s <= inputs.step]
        return _by_name(due[-1], inputs.names, "schedule weights") if due else None

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, state: Mapping[str, Any]) -> None:
        pass


class OdmController:
    """Online data mixing (Albalak, Pan, Raffel, Wang 2023): EXP3 over sources, the training loss as reward.

    Written from the paper's description. At decision ``t`` (from 1), with ``K`` sources:

    - each trained source's reward estimate is smoothed towards its importance-weighted loss,
      ``R_i <- alpha R_i + (1 - alpha) L_i / pi_i`` (``L_i`` its mean loss per token over the interval,
      ``pi_i`` its share in force): a source the model finds hard is rewarded;
    - the exploration rate is ``eps_t = min(1/K, sqrt(ln K / (K t)))``;
    - the new shares are ``pi_i = (1 - K eps_t) softmax(eps_{t-1} R)_i + eps_t`` (``eps_0 = 1/K``).

    The paper samples one domain per batch and updates only its estimate; a mixture trains every
    source in each interval, so every source with loss tokens is updated at each decision.
    """

    name = "odm"
    keys: ClassVar[tuple[str, ...]] = ("alpha",)

    def __init__(self, alpha: float = 0.9) -> None:
        if not 0 <= alpha < 1:
            raise ConfigError(f"mixing.alpha must be in [0, 1), got {alpha!r}")
        self.alpha = float(alpha)
        self.t = 0
        self.rewards: list[float] = []
        self.eps_prev: float | None = None

    @classmethod
    def from_args(cls, args: ControllerArgs) -> OdmController:
        """From ``alpha`` (reward smoothing, in [0, 1); default 0.9)."""
        return cls(args.number("alpha", 0.9))

    def params(self) -> dict[str, Any]:
        return {"alpha": self.alpha}

    def propose(self, inputs: MixingInputs) -> Sequence[float] | None:
        k = len(inputs.names)
        if len(self.rewards) != k:
            self.rewards = [0.0] * k
        for i, (loss, share) in enumerate(zip(inputs.mean_loss(), inputs.weights)):
            if loss is not None and share > 0:
                self.rewards[i] = self.alpha * self.rewards[i] + (1 - self.alpha) * loss / share
        self.t += 1
        eps = min(1 / k, math.sqrt(math.log(k) / (k * self.t)))
        prev = self.eps_prev if self.eps_prev is not None else 1 / k
        top = max(prev * r for r in self.rewards)
        gibbs = [math.exp(prev * r - top) for r in self.rewards]  # shifted by the largest: no overflow
        total = math.fsum(gibbs)
        self.eps_prev = eps
        return [(1 - k * eps) * g / total + eps for g in gibbs]

    def state(self) -> dict[str, Any]:
        return {"t": self.t, "rewards": list(self.rewards), "eps_prev": self.eps_prev}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.t = int(state.get("t", 0))
        self.rewards = [float(r) for r in state.get("rewards", [])]
        eps = state.get("eps_prev")
        self.eps_prev = None if eps is None else float(eps)


def _by_name(weights: Mapping[str, float], names: Sequence[str], what: str) -> list[float]:
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ConfigError(f"{what}: unknown source(s) {', '.join(map(repr, unknown))}; sources are {', '.join(names)}")
    out = [float(weights.get(n, 0)) for n in names]
    if any(not math.isfinite(w) or w < 0 for w in out) or not math.fsum(out) > 0:
        raise ConfigError(f"{what}: weights must be finite, >= 0 and not all 0, got {dict(weights)}")
    return out

