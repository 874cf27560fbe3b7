"""The same batches in every execution configuration: run before anything is measured.

Execution options never change the data (Pipeline.options): the same batches, provenance and cursors,
across a restore, must come out of every configuration in ``CONFIGS``, and the same as those the
baseline run recorded. ``case_digests`` runs in the project venv (``bench/cases.py digests``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from harness import Runner, without_timing
from loaders.common import EOS, load_tokenizer
from measure import emit

CONFIGS = {
    "default (prefetch 0, readahead 1, reader_threads 1)": {},
    "sync (prefetch 0, readahead 0, reader_threads 0)": {"prefetch": 0, "readahead": 0, "reader_threads": 0},
    "more threads (prefetch 4, readahead 3, reader_threads 2)": {"prefetch": 4, "readahead": 3, "reader_threads": 2},
}


def _digest_run(make: Callable[[], Any], n: int, restore_at: int | None = None) -> str:
    h = hashlib.sha256()
    p = make()
    it = iter(p)
    for k in range(n):
        b = next(it)
        h.update(b.digest.encode())
        h.update(repr((b.lane, b.lane_index, tuple(b.cursor), b.provenance)).encode())
        if restore_at == k:
            st = json.loads(json.dumps(p.checkpoint()))
            p.close()
            p = make()
            p.restore(st)
            it = iter(p)
    p.close()
    return h.hexdigest()[:16]


def _pipelines(a: dict) -> dict[str, tuple[Callable[[], Any], int, int]]:
    """The five pipelines: name -> (a maker of the pipeline, batches, the batch after which it restores)."""
    from zephon_core import JsonlSource, MegatronIndexedSource, Pipeline, StaticMixture, TokenArraySource

    tok = load_tokenizer(a["tokenizer"])
    opts = a.get("options", {})

    def tokenize(par: int, C: int | None = None, dp: tuple[int, int] = (1, 0), chunk: int = 64,
                 shuffle: int | None = None) -> Callable[[], Any]:
        def make() -> Any:
            src = JsonlSource(a["jsonl"], cache_dir=a["index_cache"])
            mix = StaticMixture([src], seed=3, chunk_size=chunk)
            p = Pipeline(mix).tokenize(tok, eos_id=EOS, parallelism=par).pack(128)
            if shuffle:
                p = p.shuffle(shuffle)
            return p.batch(4).options(canonical_replicas=C or dp[0], dp_degree=dp[0], dp_group_id=dp[1], **opts)
        return make

    def pretok(kind: str, C: int = 1, exhausted: str = "repeat", mode: str = "concat",
               weights: list[int] | None = None) -> Callable[[], Any]:
        def make() -> Any:
            def npy() -> Any:
                return TokenArraySource(a["tokens"], a["offsets"])

            def mg() -> Any:
                return MegatronIndexedSource(a["megatron"])

            srcs = [npy(), mg()] if kind == "mix" else [npy() if kind == "npy" else mg()]
            mix = StaticMixture(srcs, weights=weights, seed=5, chunk_size=16, exhausted=exhausted)
            return Pipeline(mix).pack(256, mode=mode).shuffle(8).batch(2).options(canonical_replicas=C, **opts)
        return make

    return {
        "tokenize p1": (tokenize(1), 40, 17),
        "tokenize p2 C4 dp2/1 shuffle": (tokenize(2, C=4, dp=(2, 1), chunk=16, shuffle=4), 40, 9),
        "pretok npy C8 pad": (pretok("npy", C=8, mode="pad"), 300, 131),
        "pretok mix 3:1 stop": (pretok("mix", C=2, exhausted="stop", weights=[3, 1]), 400, 201),
        "pretok megatron C1": (pretok("megatron"), 3000, 1500),
    }


def case_digests(a: dict) -> None:
    """Content digests of batches, with provenance and cursors, for five pipelines (each across a restore),
    with the execution options ``a["options"]`` (prefetch, readahead, reader_threads)."""
    emit({name: _digest_run(make, n, restore_at=k) for name, (make, n, k) in _pipelines(a).items()})


def check(r: Runner, base: dict, baseline: dict | None) -> dict:
    """The digests in every configuration of the checkout; and, where the baseline run recorded them, its digests."""
    runs = {}
    for name, opts in CONFIGS.items():
        res = r.case("project", "digests", {**base, "options": opts}, timeout=300, label=f"digests {name}")
        runs[name] = without_timing(res)
    vals = list(runs.values())
    identical = all("error" not in x for x in vals) and all(x == vals[0] for x in vals[1:])
    out: dict[str, Any] = {"runs": runs, "identical": identical}
    ref = next(iter(((baseline or {}).get("determinism") or {}).get("runs", {}).values()), None)
    if ref is not None and baseline is not None:
        out["same_as_baseline"] = ref == vals[0]
        out["baseline_commit"] = baseline["machine"]["git_commit"]
    return out


def summary(det: dict) -> str:
    """The log line."""
    line = f"  same batches in {len(det['runs'])} execution configurations: {det['identical']}"
    if "same_as_baseline" in det:
        line += f"; same as the baseline ({det['baseline_commit']}): {det['same_as_baseline']}"
    return line


def section(R: dict) -> list[str]:
    """The results.md line (and the headline's)."""
    det = R.get("determinism")
    if not det:
        return []
    n = len(det.get("runs", {}))
    line = (f"Same batches (content digests, provenance, cursors, across a restore; 5 pipelines) in {n} execution "
            f"configurations ({'; '.join(det.get('runs', {}))}): **{'yes' if det.get('identical') else 'NO'}**")
    if "same_as_baseline" in det:
        same = "yes" if det["same_as_baseline"] else "NO"
        line += f"; the same as the baseline's checkout ({det['baseline_commit']}): **{same}**"
    return [line + ".\n"]
