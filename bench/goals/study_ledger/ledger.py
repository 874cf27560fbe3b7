"""The ledger's cost (issue #35): building a run's ledger from its audit logs and by replay, writing it as Parquet,
and a document -> steps lookup.

    source scripts/env.sh && PYTHONPATH=.:bench $ZEPHON_PY bench/goals/study_ledger/ledger.py [--steps N] [--quick]

The bundled curriculum (configs/data/curriculum.toml, standalone: its tokenizer, seq_len 128, 8 lanes of 2
rows a batch, 8 batches a step) runs ``--steps`` global steps (default 4,000; 400 with ``--quick``) on 2
data-parallel groups to a merged state, each group writing its batch audit log (``log_line``, as the adapters
do); then, in this process:

* ``logs_rows_per_s``: ledger rows (stretches of packed rows) per second of ``ledger_from_logs``, reading and
  parsing the two log files and checking them against the state (no pipeline, no corpus read, no tokenizer);
  ``decode_rows_per_s``: the part of it that grows with the rows, decoding the lines' ``rows`` fields (at 3
  stretches a batch here the lines' other fields cost more; a batch of 1,024 rows of 8,192 tokens has thousands);
* ``replay_rows_per_s``: the same of ``build_ledger``, which cuts the run's batches again from the state (the
  corpus read and tokenized again); the two ledgers are asserted equal row for row;
* ``hash_s``: reading every document the run trained on once, raw, for its content hash (what the first
  Parquet write, a hash query or a step's printed rows pay; the ledger itself never needs it);
* ``write_rows_per_s``: rows per second of writing the whole ledger as one Parquet file, hashes known, the
  median of 3 (goal >= 1M);
* ``lookup_s``: one document -> steps lookup from that file (a filtered Parquet read), the median of 5
  (goal < 1 s); ``lookup_memory_s``: the same on the ledger in memory;
* ``log_bytes_per_batch``: the audit log's size a batch, and ``log_rows_bytes_per_batch`` its ``rows`` field's part.

Prints one ``RESULT {json}`` line; ``bash bench/run.sh --only ledger`` runs it as an untargeted goal
(the goals are reported, not asserted).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from measure import emit

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "configs" / "data" / "curriculum.toml"
B = 8


def _timed(fn: Any, n: int = 1) -> tuple[Any, float]:
    """``fn()``'s result and the median of ``n`` timings of it."""
    times, out = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def _build_both(recipe: Any, steps: int, tmp: str) -> dict[str, Any]:
    """The run, its logs, and both ledgers with their build times."""
    import numpy as np

    from zephon_core.integration.batch_log import decode_rows, log_line
    from zephon_core.report.inputs import read_logs
    from zephon_core.verify.ledger import COLUMNS, build_ledger
    from zephon_core.verify.ledger_logs import ledger_from_logs
    from zephon_core.verify.simulate import Phase, run_phase

    def make(G: int, g: int):
        return recipe.build_standalone(dp_degree=G, dp_group_id=g, prefetch=0)
    paths = [f"{tmp}/batches-rank{g}.log" for g in (0, 1)]
    files = [open(p, "w", encoding="utf-8") for p in paths]
    _, state = run_phase(make, Phase(2, steps), B, None, on_batch=lambda g, b: files[g].write(log_line(b)))
    for f in files:
        f.close()
    logs, logs_s = _timed(lambda: ledger_from_logs(read_logs(paths), state, B, recipe.sources()))
    replay, replay_s = _timed(lambda: build_ledger(lambda: make(1, 0), state, B))
    assert all(np.array_equal(logs.columns[k], replay.columns[k]) for k in COLUMNS) and logs.digests == replay.digests
    logged = [b.rows for _, b in read_logs(paths)]
    _, decode_s = _timed(lambda: decode_rows(logged, [""] * len(logged)), 3)
    text = [Path(p).read_text() for p in paths]
    lines = sum(t.count("\n") for t in text)
    size = sum(map(len, text))
    rows_field = sum(len(line.rsplit(" ", 1)[1]) + 1 for t in text for line in t.splitlines())
    return {"ledger": logs, "logs_s": logs_s, "replay_s": replay_s, "decode_s": decode_s,
            "log_bytes_per_batch": round(size / lines, 1), "log_rows_bytes_per_batch": round(rows_field / lines, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--work", help="unused (the bundled corpus is read in place)")
    ap.add_argument("--out")
    a = ap.parse_args()
    steps = 400 if a.quick else a.steps

    import pyarrow.parquet as pq  # imported before the clock runs: the write rate is the writing's

    from zephon_core.recipe import load_recipe

    with tempfile.TemporaryDirectory() as tmp:
        built = _build_both(load_recipe(RECIPE), steps, tmp)
        ledger = built["ledger"]
        s, d = int(ledger.columns["source"][0]), int(ledger.columns["document"][0])
        _, hash_s = _timed(lambda: ledger.hashes)
        path = f"{tmp}/ledger.parquet"
        _, write_s = _timed(lambda: ledger.write_parquet(path), 3)  # the first also pays pyarrow's set-up
        size = Path(path).stat().st_size
        where = [("document", "=", d), ("source", "=", ledger.sources[s])]
        hit, lookup_s = _timed(lambda: pq.read_table(path, columns=["step"], filters=where), 5)
    assert sorted(set(hit.column("step").to_pylist())) == ledger.steps_of(s, d)
    _, memory_s = _timed(lambda: ledger.steps_of(s, d))
    rows = len(ledger)
    res = {"steps": steps, "batches": len(ledger.digests), "rows": rows, "documents": len(ledger.documents()),
           "logs_s": round(built["logs_s"], 3), "logs_rows_per_s": round(rows / built["logs_s"]),
           "decode_rows_per_s": round(rows / built["decode_s"]), "replay_s": round(built["replay_s"], 3),
           "replay_rows_per_s": round(rows / built["replay_s"]),
           "hash_s": round(hash_s, 3), "write_s": round(write_s, 4), "write_rows_per_s": round(rows / write_s),
           "parquet_bytes": size, "bytes_per_row": round(size / rows, 2), "lookup_s": round(lookup_s, 4),
           "lookup_memory_s": round(memory_s, 5), "log_bytes_per_batch": built["log_bytes_per_batch"],
           "log_rows_bytes_per_batch": built["log_rows_bytes_per_batch"]}
    print(f"ledger of {steps} steps: {rows:,} rows, built from the logs at {res['logs_rows_per_s']:,} rows/s, by "
          f"replay at {res['replay_rows_per_s']:,} rows/s; written at {res['write_rows_per_s']:,} rows/s "
          f"({res['bytes_per_row']} B/row); document -> steps in {res['lookup_s']} s from Parquet, "
          f"{res['lookup_memory_s']} s in memory; log {res['log_bytes_per_batch']} B/batch")
    emit(res, a.out)


if __name__ == "__main__":
    main()
