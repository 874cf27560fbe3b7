"""The distributed-training guide's examples, run as written on 8 real ranks."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
MULTI_RANK = [
    "data_identity_device_mesh.py",
    "data_identity_hsdp_mesh.py",
    "coordination_identity.py",
    "coordination_identity_per_dp_group.py",
]


@pytest.mark.mpi(min_size=8)
@pytest.mark.parametrize("name", MULTI_RANK)
def test_guide_example_runs_on_8_ranks(name, gloo_pg, world_size, shared_tmp, monkeypatch, capsys, allgather):
    if world_size != 8:
        pytest.skip("the guide's mesh examples are written for 8 ranks")
    monkeypatch.setenv("ZEPHON_EXAMPLE_AGGREGATE_DIR", str(shared_tmp / "agg"))
    monkeypatch.syspath_prepend(str(EXAMPLES))
    sys.modules.pop("common", None)
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    out = capsys.readouterr().out
    lines = [line for line in allgather(out) if line]
    if name == "data_identity_device_mesh.py":
        # tp peers print the same digest; 4 groups -> 4 distinct first batches
        digests = {line.split("first batch ")[1].split()[0] for line in lines}
        assert len(lines) == 8 and len(digests) == 4, lines
    elif name == "data_identity_hsdp_mesh.py":
        assert len({line.split(": ")[1] for line in lines}) == 4, lines
    elif name == "coordination_identity.py":
        assert all("lanes [0, 1, 2, 3, 4, 5, 6, 7]" in line for line in lines) and len(lines) == 8, lines
    else:
        assert len(lines) == 4 and all("merged state of 4 lanes" in line for line in lines), lines
