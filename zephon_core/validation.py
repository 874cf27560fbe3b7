"""The one vocabulary for checking user-supplied values.

Every option, operator argument and state field is checked by these helpers,
so a wrong value is reported the same way everywhere: what was wrong (naming
the field), what was given, and what is allowed. ``error`` selects the
exception type (``ConfigError`` for settings, ``StateError`` for checkpoint
fields); ``what`` is the name the message starts with.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from zephon_core.errors import ConfigError, ZephonError

T = TypeVar("T")


def is_int(value: Any) -> bool:
    """An integer, Python or NumPy, and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def require_int(value: Any, what: str, minimum: int | None = None, *, error: type[ZephonError] = ConfigError) -> int:
    """``value`` as a plain ``int``, refused unless it is an integer ``>= minimum``."""
    if not is_int(value):
        raise error(f"{what} must be an integer, got {type(value).__name__} {value!r}")
    if minimum is not None and int(value) < minimum:
        raise error(f"{what} must be >= {minimum}, got {value}")
    return int(value)


def require_positive_number(value: Any, what: str, *, error: type[ZephonError] = ConfigError) -> float:
    """``value`` as a number, refused unless it is finite and ``> 0`` (bools are refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not float(value) > 0:
        raise error(f"{what} must be a positive finite number, got {value!r}")
    return float(value)


def require_choice(value: T, what: str, choices: Sequence[T], *, error: type[ZephonError] = ConfigError) -> T:
    """``value``, refused unless it is one of ``choices``."""
    if value not in choices:
        raise error(f"{what} must be one of {tuple(choices)}, got {value!r}")
    return value
