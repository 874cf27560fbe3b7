"""A real run's ledger built both ways by ``zephon ledger`` (issue #35): from the audit logs its ranks wrote, and by
replay with ``--replay``; the e2e tests of both adapters hold the two equal."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from support.cli import zephon


def ledger_both_ways(recipe: Path, state: Path, shape: list[str], logs: list[str], out: Path) -> tuple[str, pa.Table]:
    """``zephon ledger`` of ``state`` from ``logs`` (globs) and by replay: both must pass their log checks (from the
    logs: every line's run and checksum; by replay: every batch compared) and write the same Parquet table;
    returns the from-logs run's output and its table."""
    said, tables = {}, {}
    for how in ("logs", "replay"):
        path = out / f"{state.name}-{how}.parquet"
        r = zephon("ledger", str(recipe), "--state", str(state), *shape, "--logs", *logs, "--parquet", str(path),
                   *(["--replay"] if how == "replay" else []))
        checked = "every batch agrees with the replay" if how == "replay" else "run identities and checksums verified"
        assert r.returncode == 0 and checked in r.stdout, r.stdout + r.stderr
        said[how], tables[how] = r.stdout, pq.read_table(path)
    assert "built from the batch audit logs" in said["logs"] and "built by replay" in said["replay"], said
    assert tables["logs"].num_rows > 0 and tables["logs"].equals(tables["replay"])
    return said["logs"], tables["logs"]
