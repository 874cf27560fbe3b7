"""The ledger's cost (issue #35): building a run's ledger, writing it as Parquet, and a document -> steps lookup.

    source scripts/env.sh && PYTHONPATH=.:bench $ZEPHON_PY bench/goals/study_ledger/ledger.py [--steps N] [--quick]

The bundled curriculum (configs/data/curriculum.toml, standalone: its tokenizer, seq_len 128, 8 lanes of 2
rows a batch, 8 batches a step) runs ``--steps`` global steps (default 4,000; 400 with ``--quick``) on 2
data-parallel groups to a merged state; then, in this process:

* ``build_rows_per_s``: ledger rows (stretches of packed rows) per second of ``build_ledger``, which cuts the
  run's batches again from the state and hashes every document (the corpus is read and tokenized again:
  this figure is the recomputation's);
* ``write_rows_per_s``: rows per second of writing the whole ledger as one Parquet file, the median of 3
  (goal >= 1M);
* ``lookup_s``: one document -> steps lookup from that file (a filtered Parquet read), the median of 5
  (goal < 1 s); ``lookup_memory_s``: the same on the ledger in memory.

Prints one ``RESULT {json}`` line; ``bash bench/run.sh --only ledger`` runs it as an untargeted goal
(the goals are reported, not asserted).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from measure import emit

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "configs" / "data" / "curriculum.toml"
B = 8


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
    from zephon_core.verify.ledger import build_ledger
    from zephon_core.verify.simulate import Phase, run_phase

    recipe = load_recipe(RECIPE)
    def make(G: int, g: int):
        return recipe.build_standalone(dp_degree=G, dp_group_id=g, prefetch=0)
    _, state = run_phase(make, Phase(2, steps), B, None)
    t0 = time.perf_counter()
    ledger = build_ledger(lambda: make(1, 0), state, B)
    build_s = time.perf_counter() - t0
    s, d = int(ledger.columns["source"][0]), int(ledger.columns["document"][0])
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/ledger.parquet"
        writes = []
        for _ in range(3):  # the first write also pays pyarrow's one-time set-up
            t0 = time.perf_counter()
            ledger.write_parquet(path)
            writes.append(time.perf_counter() - t0)
        write_s = statistics.median(writes)
        size = Path(path).stat().st_size
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            where = [("document", "=", d), ("source", "=", ledger.sources[s])]
            hit = pq.read_table(path, columns=["step"], filters=where)
            found = sorted(set(hit.column("step").to_pylist()))
            times.append(time.perf_counter() - t0)
    assert found == ledger.steps_of(s, d)
    t0 = time.perf_counter()
    ledger.steps_of(s, d)
    memory_s = time.perf_counter() - t0
    rows = len(ledger)
    res = {"steps": steps, "batches": len(ledger.digests), "rows": rows, "documents": len(ledger.hashes),
           "build_s": round(build_s, 3), "build_rows_per_s": round(rows / build_s),
           "write_s": round(write_s, 4), "write_rows_per_s": round(rows / write_s), "parquet_bytes": size,
           "bytes_per_row": round(size / rows, 2), "lookup_s": round(statistics.median(times), 4),
           "lookup_memory_s": round(memory_s, 5)}
    print(f"ledger of {steps} steps: {rows:,} rows, built at {res['build_rows_per_s']:,} rows/s, written at "
          f"{res['write_rows_per_s']:,} rows/s ({res['bytes_per_row']} B/row); document -> steps in "
          f"{res['lookup_s']} s from Parquet, {res['lookup_memory_s']} s in memory")
    emit(res, a.out)


if __name__ == "__main__":
    main()
