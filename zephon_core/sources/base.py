"""The random-access source interface every format implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon_core.errors import DataError


class Source(ABC):
    """A random-access collection of documents.

    A document is either text (``str``), a JSON record (``dict``) or a 1-D
    integer token array, depending on the format. Implementations must be
    safe to ``read`` from several threads at once.

    A pretokenized source may also define ``read_flat(indices, headroom=0)``
    returning the documents end to end as one int64 array, after ``headroom``
    unused slots, and their lengths; pipelines without per-document operators
    then pack from it without building one array per document, and cut rows
    out of it without copying them again.
    """

    #: Short, human-readable name; defaults to the file's base name.
    name: str

    @abstractmethod
    def __len__(self) -> int:
        """Number of documents."""

    @abstractmethod
    def read(self, indices: Sequence[int]) -> list[Any]:
        """Documents at ``indices``, in that order."""

    @abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """Everything that identifies this source's content, JSON-serialisable.

        Checkpoints record it; a restore refuses a pipeline whose sources'
        fingerprints differ. It deliberately leaves the path out so that a
        corpus may be moved or copied between a run and its resume.
        """

    def token_lengths(self) -> np.ndarray | None:
        """Tokens of every document (int64), where the source knows them without reading documents.

        Pretokenized sources answer from their index; token-weighted mixtures
        (``weight_by="tokens"``) then weigh sources by exact token counts.
        """
        return None

    def byte_lengths(self) -> np.ndarray | None:
        """Stored bytes of every document (int64), where the source knows them without reading documents.

        Token-weighted mixtures estimate a text document's tokens from its size
        (``zephon_core.curriculum.token_index``); None: every document counts
        as the source's sampled mean.
        """
        return None

    def describe(self) -> str:
        """One line for ``explain()``."""
        return f"{type(self).__name__}({self.name!r}, {len(self)} documents)"

    def _require_nonempty(self, where: str) -> None:
        if len(self) == 0:
            raise DataError(f"{where}: source has no documents; point it at files that hold some", recipe_key="path")


#: The fix a message about a missing text field or column ends with: a recipe names the key, so does this.
SET_TEXT_FIELD = "; set text_field to the field or column that holds the text"
