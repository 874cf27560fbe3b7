"""The guide's single-process examples, run as written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"


@pytest.mark.parametrize("name", ["canonical_replicas.py", "explain_plan.py", "staged_mixture.py", "live_replicas.py",
                                  "live_torchft.py"])
def test_single_process_example(name):
    out = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=300, check=True).stdout
    if name == "canonical_replicas.py":
        assert "owns lanes [0, 1, 2, 3]" in out
    elif name == "live_replicas.py":
        assert out.count("matches: True") == 3 and "committed steps: [3, 3, 3]" in out
    elif name == "live_torchft.py":
        assert "step 2: lanes [0, 1, 2, 3], committed steps 3" in out and "at {3}" in out
    elif name == "staged_mixture.py":
        assert "240 batches identical to the whole schedule from the start" in out and "stage 2 'anneal'" in out
    else:
        assert "per node (8 pipeline(s))" in out and "dp_group_id=0 of dp_degree=8" in out
