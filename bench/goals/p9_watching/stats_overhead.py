"""P9: what watching a run costs: P1/P2 throughput with ``Pipeline.stats()`` every batch vs no accounting at all.

    PYTHONPATH=.:bench python bench/goals/p9_watching/stats_overhead.py
        [--work DIR] [--rounds N] [--seconds S] [--out FILE.json]

Three variants of the same pipeline run in one process, interleaved round by round (load on a
shared machine drifts over minutes, so every ratio compares neighbouring measurements):

* ``off``: the per-batch tally and the execution counters replaced by no-ops, i.e. the loader
  as it was before it counted anything (the baseline);
* ``default``: the loader as shipped: every delivered batch tallied, counters kept;
* ``stats``: as shipped, and ``pipeline.stats()`` taken every ``LOG_EVERY`` batches, as an adapter
  does every ``log_freq`` / ``--log-interval`` steps (Megatron's default interval is 100 steps);
* ``stats_every_batch``: ``stats()`` after every batch, the worst case. A P2 batch takes ~30 µs
  here, a thousand times less than any training step, so this row prices ``stats()`` itself.

Pipelines: P1's (JSONL -> tokenize -> pack 512 -> batch 8) and P2's (a pretokenized token array
-> pack 512 -> batch 8), on the bench corpus (bench/corpus.py). The goal: ``stats`` within 2%
of ``off`` in tokens per CPU second. Prints one ``RESULT {json}`` line; ``bench/run.py --only P9`` runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import corpus
from measure import emit

ROOT = Path(__file__).resolve().parents[3]

SEQ_LEN, BATCH, SEED = 512, 8, 7
VARIANTS = ("off", "default", "stats", "stats_every_batch")
LOG_EVERY = 100


@contextlib.contextmanager
def accounting_off() -> Iterator[None]:
    """The engine's Deliveries keeping only the cursors, and the counters as no-ops: the loader before it counted."""
    from zephon_core import metrics
    from zephon_core.pipeline.engine import Deliveries

    def cursors_only(self: Deliveries, b: Any) -> None:
        self._at[b.lane] = (b.cursor, b.lane_index + 1)

    saved = (Deliveries.record, metrics.Counters.add, metrics.Counters.timed)
    Deliveries.record = cursors_only  # type: ignore[method-assign]
    metrics.Counters.add = lambda self, *a, **k: None  # type: ignore[method-assign]
    metrics.Counters.timed = lambda self, name: contextlib.nullcontext()  # type: ignore[method-assign]
    try:
        yield
    finally:
        Deliveries.record, metrics.Counters.add, metrics.Counters.timed = saved  # type: ignore[method-assign]


def pipelines(paths: dict[str, str], index_cache: str) -> dict[str, Callable[[], Any]]:
    from tokenizers import Tokenizer

    from zephon_core import JsonlSource, Pipeline, StaticMixture, TokenArraySource

    tok = Tokenizer.from_file(str(corpus.TOKENIZER))

    def p1() -> Any:
        src = JsonlSource(paths["jsonl"], cache_dir=index_cache)
        ws = StaticMixture([src], seed=SEED, chunk_size=64)
        return Pipeline(ws).tokenize(tok, eos_id=corpus.EOS_ID).pack(SEQ_LEN).batch(BATCH)

    def p2() -> Any:
        ws = StaticMixture([TokenArraySource(paths["tokens"], paths["offsets"])], seed=SEED, chunk_size=64)
        return Pipeline(ws).pack(SEQ_LEN).batch(BATCH)

    return {"P1 tokenize": p1, "P2 TokenArraySource": p2}


def measure(make: Callable[[], Any], variant: str, seconds: float) -> float:
    """Steady-state tokens per CPU second of one fresh pipeline after a warm-up.

    CPU seconds (all threads of the process), not wall: the ratios price the work the
    accounting adds, and CPU time is far less disturbed than wall time by other load.
    """
    with accounting_off() if variant == "off" else contextlib.nullcontext():
        p = make()
        it = iter(p)
        for _ in range(10):
            next(it)
        every = {"stats": LOG_EVERY, "stats_every_batch": 1}.get(variant, 0)
        n, t0, c0 = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - t0 < seconds or n < 50:
            next(it)
            n += 1
            if every and n % every == 0:
                p.stats()
        cpu = time.process_time() - c0
        p.close()
    return n * BATCH * SEQ_LEN / cpu


def run(work: Path, rounds: int, seconds: float) -> dict[str, Any]:
    meta = corpus.build(work, log=lambda m: print("# " + m, file=sys.stderr, flush=True))
    paths = corpus.paths(work, meta)
    makers = pipelines(paths, str(work / "index-cache"))
    samples: dict[str, dict[str, list[float]]] = {name: {v: [] for v in VARIANTS} for name in makers}
    for k in range(rounds):
        for name, make in makers.items():
            order = VARIANTS[k % len(VARIANTS):] + VARIANTS[: k % len(VARIANTS)]  # rotated: none always runs first
            for variant in order:
                samples[name][variant].append(measure(make, variant, seconds))
    out: dict[str, Any] = {"rounds": rounds, "seconds": seconds, "log_every": LOG_EVERY, "cases": {}}
    for name, by in samples.items():
        med = {v: statistics.median(xs) for v, xs in by.items()}
        # Per round, each variant vs off measured back to back; the median of those ratios.
        ratios = {f"{v}_over_off": statistics.median(x / o for x, o in zip(by[v], by["off"])) for v in VARIANTS[1:]}
        out["cases"][name] = {"tokens_per_cpu_s": med, **ratios, "samples": by}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(ROOT / "bench" / ".work"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    res = run(Path(a.work), a.rounds, a.seconds)
    for name, c in res["cases"].items():
        t = c["tokens_per_cpu_s"]
        print(f"# {name:22s} " + "  ".join(f"{v} {t[v] / 1e3:9.1f}" for v in VARIANTS) + " k tok/CPU-s  "
              + "  ".join(f"{v}/off {c[v + '_over_off']:.3f}" for v in VARIANTS[1:]), file=sys.stderr)
    emit(res, a.out)


if __name__ == "__main__":
    main()
