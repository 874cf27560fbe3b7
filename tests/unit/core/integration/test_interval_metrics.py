"""IntervalMetrics: what both adapters log for Zephon every logging interval, from Pipeline.stats()."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zephon_core import MemorySource, Pipeline, Stage, StagedMixture
from zephon_core.integration import IntervalMetrics
from zephon_core.metrics import COUNTER_NAMES


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _pipeline() -> Pipeline:
    a = MemorySource([[1] * (3 + i % 5) for i in range(40)], name="web")
    b = MemorySource([[2] * (2 + i % 3) for i in range(30)], name="code")
    stages = [Stage({"web": 3, "code": 1}, "warmup"), Stage({"web": 1, "code": 1}, "anneal", start_chunk=6)]
    ws = StagedMixture([a, b], stages, seed=3, chunk_size=8)
    return Pipeline(ws).pack(8).batch(2).options(canonical_replicas=2, reader_threads=0, readahead=0)


def test_counters_become_per_interval_figures_and_the_rest_stays_cumulative():
    clock = Clock()
    metrics = IntervalMetrics(clock=clock)
    p = _pipeline()
    it = iter(p)
    for _ in range(6):
        next(it)
    first = p.stats()
    clock.now += 4.0
    one = metrics.take(first)
    for _ in range(10):
        next(it)
    second = p.stats()
    # Pretend the interval waited 1.5 s more than it did, so the fraction is exact.
    second = replace(second, wait_s=first.wait_s + 1.5)
    clock.now += 6.0
    two = metrics.take(second)

    s = two.scalars
    for name in COUNTER_NAMES:
        assert f"zephon/{name}" not in s, f"the cumulative counter {name} is logged"
        assert s[f"zephon/interval/{name}"] == pytest.approx(second.counters[name] - first.counters[name]), name
    assert "zephon/wait_s" not in s and s["zephon/interval/wait_s"] == pytest.approx(1.5)
    assert s["zephon/interval/seconds"] == 6.0 and s["zephon/interval/wait_fraction"] == pytest.approx(1.5 / 6.0)
    assert one.scalars["zephon/interval/seconds"] == 4.0
    # Per source, the figures are what the pipeline delivered in all (not in the interval).
    web, code = second.sources
    assert (s["zephon/tokens/web"], s["zephon/tokens/code"]) == (web.tokens, code.tokens)
    assert s["zephon/documents/code"] == code.documents and s["zephon/epochs/web"] == pytest.approx(web.epochs)
    assert s["zephon/batches"] == 16 and s["zephon/stage"] == second.stage == 1
    assert s["zephon/padding_fraction"] == pytest.approx(second.padding_fraction)
    assert all(k.startswith("zephon/") and isinstance(v, float) for k, v in s.items())
    assert not any(k.startswith("zephon/run/") for k in s), "no merged state yet"
    assert two.line.startswith("zephon: stage 1 (anneal) | waited 1.500 s of 6.00 s (25.0%)")
    assert f"web={web.tokens:,}" in two.line and "run share" not in two.line


def test_run_figures_follow_the_last_checkpoint():
    p = _pipeline()
    it = iter(p)
    for _ in range(8):
        next(it)
    p.checkpoint()
    for _ in range(4):
        next(it)
    figures = IntervalMetrics(prefix="data/").take(p.stats())
    s = figures.scalars
    run_tokens = {name: s[f"data/run/tokens/{name}"] for name in ("web", "code")}
    assert s["data/run/batches"] == 8 and s["data/batches"] == 12
    assert sum(run_tokens.values()) < s["data/tokens/web"] + s["data/tokens/code"]
    assert s["data/run/share/web"] == pytest.approx(run_tokens["web"] / sum(run_tokens.values()))
    assert f"run share web={s['data/run/share/web']:.3f}" in figures.line
