"""Exception types raised by zephon_core.

Every error a user can cause derives from ``ZephonError`` and from the matching
built-in type, so ``except ValueError`` keeps working for callers who do not
know about Zephon.
"""

from __future__ import annotations


class ZephonError(Exception):
    """Base class of every error Zephon raises on purpose."""


class ConfigError(ZephonError, ValueError):
    """An option, recipe field or operator argument is invalid."""


class DataError(ZephonError, ValueError):
    """A source file is malformed; the message names the file and line/field.

    ``recipe_key``: the key of a recipe's source entry that the problem is about (``path``, ``text_field``),
    which a recipe names in its own message (the source itself knows no recipe).
    """

    def __init__(self, message: str, *, recipe_key: str | None = None) -> None:
        super().__init__(message)
        self.recipe_key = recipe_key


class StateError(ZephonError, ValueError):
    """A checkpoint state cannot be restored into this pipeline."""


class AggregationError(ZephonError, RuntimeError):
    """Ranks could not agree on a checkpoint (timeout, mismatch, bad round)."""


class IntegrationError(ConfigError):
    """A training run an adapter refuses to start, or a loader state it cannot use."""


class CliError(ZephonError):
    """A user-facing failure of the ``zephon`` command line: printed as one line, exit status 1."""
