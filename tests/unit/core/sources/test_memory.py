"""Documents held in a list (``MemorySource``): reads, refusals, the fingerprint."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_core import DataError, MemorySource


def test_memory_source():
    src = MemorySource(["a", {"text": "b"}, [1, 2]], name="m")
    assert len(src) == 3
    a, b, c = src.read([0, 1, 2])
    assert a == "a" and b == {"text": "b"} and c.tolist() == [1, 2] and c.dtype == np.int64
    with pytest.raises(DataError):
        MemorySource([])
    with pytest.raises(DataError):
        MemorySource([object()]).fingerprint()
    assert MemorySource(["a"]).fingerprint() != MemorySource(["b"]).fingerprint()
    assert MemorySource([[1]]).fingerprint() != MemorySource(["\x01"]).fingerprint()
