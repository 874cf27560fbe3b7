"""Staged curricula on the bench corpus: realized token shares, stage boundaries, throughput, index cost.

    source scripts/env.sh && PYTHONPATH=.:bench $ZEPHON_PY bench/goals/study_curriculum/curriculum.py [--quick]

The bench corpus (bench/corpus.py, built once under bench/.work) is split into
three sources by document length (shortest, middle and longest thirds), the
way real sources differ (reference entries, prose, code). Measured, in one
process, zephon_core only:

* shares: over every window of 1M tokens of the global stream (8 lanes, one
  batch of 8 rows of 513 tokens per lane per step, windows sliding by a step),
  each source's share of the tokens against its weight 0.5 / 0.3 / 0.2:
  weights by documents (``StaticMixture``), by tokens over the pretokenized
  copy (exact counts), and by tokens over the JSONL text (estimated counts);
* boundary: a stage starting at optimizer step 200 (its start converted to a
  chunk by planned tokens): the steps at which the lanes' data actually
  switched;
* throughput: batches per wall and per CPU second of the same data as a
  ``StaticMixture`` and as a one-stage ``StagedMixture`` (one source, and the
  three), and of token weights beside the document weights that give the same
  expected token shares (shorter documents per token cost more, whatever picks
  them), interleaved rounds, medians;
* cost: building one epoch's token index (per million documents) and computing
  32 chunk descriptors (static vs token-weighted).

Writes bench/results/curriculum.json (``--out``) and prints the figures docs/performance.md shows, then one
``RESULT {json}`` line: ``bash bench/run.sh --only curriculum`` runs it as an untargeted goal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import corpus
import numpy as np
from measure import emit

from zephon_core import (
    JsonlSource,
    Pipeline,
    Source,
    Stage,
    StagedMixture,
    StaticMixture,
    TokenArraySource,
    token_counter,
)

ROOT = Path(__file__).resolve().parents[3]

WORK = ROOT / "bench" / ".work"
SEQ_LEN, BATCH, C, EOS = 512, 8, 8, 1
WEIGHTS = {"short": 0.5, "middle": 0.3, "long": 0.2}
WINDOW_TOKENS = 1_000_000


def split_sources(paths: dict[str, str]) -> dict[str, dict[str, str]]:
    """The corpus's documents by length thirds, pretokenized and as JSONL (written once)."""
    tokens, offsets = np.load(paths["tokens"]), np.load(paths["offsets"])
    lengths = np.diff(offsets)
    out_dir = Path(paths["dir"]) / "by_length"
    order = np.argsort(lengths, kind="stable")
    parts = dict(zip(WEIGHTS, np.array_split(order, 3)))
    lines = Path(paths["jsonl"]).read_text(encoding="utf-8").splitlines(keepends=True)
    out: dict[str, dict[str, str]] = {}
    for name, ids in parts.items():
        ids = np.sort(ids)
        files = {
            "tokens": str(out_dir / f"{name}.npy"),
            "offsets": str(out_dir / f"{name}_offsets.npy"),
            "jsonl": str(out_dir / f"{name}.jsonl"),
        }
        if not Path(files["jsonl"]).exists():
            out_dir.mkdir(parents=True, exist_ok=True)
            np.save(files["tokens"], np.concatenate([tokens[offsets[i] : offsets[i + 1]] for i in ids]))
            np.save(files["offsets"], np.concatenate([[0], np.cumsum(lengths[ids])]))
            Path(files["jsonl"]).write_text("".join(lines[i] for i in ids), encoding="utf-8")
        out[name] = files
    return out


def sources(files: dict[str, dict[str, str]], text: bool) -> list:
    if text:
        return [JsonlSource(f["jsonl"], name=n, cache_dir=str(WORK / "index")) for n, f in files.items()]
    return [TokenArraySource(f["tokens"], f["offsets"], name=n) for n, f in files.items()]


def pipeline(ws, tok=None):
    p = Pipeline(ws)
    if tok is not None:
        p = p.tokenize(tok, eos_id=EOS)
    return p.pack(SEQ_LEN).batch(BATCH).options(canonical_replicas=C, dp_degree=1, dp_group_id=0, prefetch=0)


def step_tokens(p, steps: int, n_sources: int) -> np.ndarray:
    """Tokens per source of each global step (C batches, one per lane)."""
    out = np.zeros((steps, n_sources), dtype=np.int64)
    it = iter(p)
    for s in range(steps):
        for _ in range(C):
            seg = next(it).segments
            np.add.at(out[s], seg[:, 1], seg[:, 4] - seg[:, 3])
    p.close()
    return out


def window_shares(per_step: np.ndarray, target: list[float]) -> dict:
    tokens_per_step = int(per_step.sum(axis=1)[0])
    w = -(-WINDOW_TOKENS // tokens_per_step)
    cum = np.concatenate([np.zeros((1, per_step.shape[1]), dtype=np.int64), np.cumsum(per_step, axis=0)])
    win = cum[w:] - cum[:-w]
    shares = win / win.sum(axis=1, keepdims=True)
    t = np.asarray(target)
    return {
        "windows": int(len(win)),
        "window_tokens": int(w * tokens_per_step),
        "max_abs_pp": round(float(np.abs(shares - t).max() * 100), 3),
        "max_relative_pct": round(float((np.abs(shares - t) / t).max() * 100), 3),
        "mean_share": [round(float(x), 4) for x in shares.mean(axis=0)],
    }


def measure_shares(files, tok, steps: int) -> dict:
    names, target = list(WEIGHTS), list(WEIGHTS.values())
    out = {}
    by_docs = StaticMixture(sources(files, False), target, seed=3, chunk_size=64)
    out["documents, pretokenized (StaticMixture)"] = window_shares(step_tokens(pipeline(by_docs), steps, 3), target)
    for label, text in (
        ("tokens, pretokenized (exact counts)", False),
        ("tokens, text (bytes x measured ratio)", True),
    ):
        ws = StagedMixture(
            sources(files, text),
            [Stage(dict(WEIGHTS), "main", weight_by="tokens")],
            seed=3,
            chunk_size=64,
            token_counter=token_counter(tok, eos_id=EOS) if text else None,
        )
        res = window_shares(step_tokens(pipeline(ws, tok if text else None), steps, 3), target)
        if text:
            res["estimate"] = ws.definition()["token_estimates"]
        out[label] = res
    out["_sources"] = {
        n: {"documents": len(s), "mean_tokens": round(float(s.token_lengths().mean()), 1)}
        for n, s in zip(names, sources(files, False))
    }
    return out


def measure_boundary(files, steps: int = 400, at: int = 200) -> dict:
    """Stage 1 reads short+middle, stage 2 (from step `at`) only long: when does each lane switch?"""
    rows = C * BATCH
    stages = [
        Stage({"short": 1, "middle": 1}, "one", weight_by="tokens"),
        Stage({"long": 1}, "two", start_step=at, weight_by="tokens"),
    ]
    out = {}
    for by in ("tokens", "documents"):
        st = [Stage(s.weights, s.name, start_step=s.start_step, weight_by=by) for s in stages]
        ws = StagedMixture(sources(files, False), st, seed=3, chunk_size=64, tokens_per_step=rows * (SEQ_LEN + 1))
        per_step = step_tokens(pipeline(ws), steps, 3)
        mixed = np.flatnonzero((per_step[:, 2] > 0) & (per_step[:, :2].sum(axis=1) > 0)) + 1
        out[f"weight_by={by}"] = {
            "planned_step": at,
            "start_chunk": int(ws.schedule.plans[1].start_chunk),
            "first_step_with_stage_two": int(np.flatnonzero(per_step[:, 2] > 0)[0]) + 1,
            "last_step_with_stage_one": int(np.flatnonzero(per_step[:, :2].sum(axis=1) > 0)[-1]) + 1,
            "steps_mixing_both": int(len(mixed)),
        }
    return out


def rate(p, seconds: float) -> tuple[float, float]:
    """Batches per wall second and per CPU second of the process (all its threads): on a shared
    machine the second is the steadier measure of what the data path costs."""
    it = iter(p)
    for _ in range(20):
        next(it)
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        next(it)
        n += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    p.close()
    return n / wall, n / max(cpu, 1e-9)


def measure_throughput(files, paths, tok, rounds: int, seconds: float) -> dict:
    """Pairs of the same data (or, for token weights, a document-weighted mixture with the same
    expected token shares: weights / mean document lengths), so a difference is the machinery's."""
    one = [TokenArraySource(paths["tokens"], paths["offsets"], name="corpus")]
    text = [JsonlSource(paths["jsonl"], name="corpus", cache_dir=str(WORK / "index"))]
    means = [float(s.token_lengths().mean()) for s in sources(files, False)]
    same_shares = [w / m for w, m in zip(WEIGHTS.values(), means)]
    by_tokens = [Stage(dict(WEIGHTS), "main", weight_by="tokens")]
    three = [
        Stage({"short": 1, "middle": 1}, "a"),
        Stage(dict(WEIGHTS), "b", start_chunk=40, weight_by="tokens"),
        Stage({"long": 1, "short": 1}, "c", start_chunk=400, weight_by="tokens"),
    ]
    count = token_counter(tok, eos_id=EOS)
    cases = {
        "pretokenized, 1 source: StaticMixture": lambda: pipeline(StaticMixture(one, seed=3)),
        "pretokenized, 1 source: StagedMixture, one stage (same data)": lambda: pipeline(
            StagedMixture(one, [Stage({"corpus": 1})], seed=3)
        ),
        "pretokenized, 3 sources: StaticMixture 0.5/0.3/0.2": lambda: pipeline(
            StaticMixture(sources(files, False), list(WEIGHTS.values()), seed=3)
        ),
        "pretokenized, 3 sources: StagedMixture, one stage by documents (same data)": lambda: pipeline(
            StagedMixture(sources(files, False), [Stage(dict(WEIGHTS))], seed=3)
        ),
        "pretokenized, 3 sources: StaticMixture, document weights for the same token shares": lambda: pipeline(
            StaticMixture(sources(files, False), same_shares, seed=3)
        ),
        "pretokenized, 3 sources: StagedMixture, one stage by tokens": lambda: pipeline(
            StagedMixture(sources(files, False), by_tokens, seed=3)
        ),
        "pretokenized, 3 sources: StagedMixture, 3 stages": lambda: pipeline(
            StagedMixture(sources(files, False), three, seed=3)
        ),
        "text, 1 source: StaticMixture": lambda: pipeline(StaticMixture(text, seed=3), tok),
        "text, 1 source: StagedMixture, one stage (same data)": lambda: pipeline(
            StagedMixture(text, [Stage({"corpus": 1})], seed=3), tok
        ),
        "text, 3 sources: StaticMixture, document weights for the same token shares": lambda: pipeline(
            StaticMixture(sources(files, True), same_shares, seed=3), tok
        ),
        "text, 3 sources: StagedMixture, one stage by tokens (estimated)": lambda: pipeline(
            StagedMixture(sources(files, True), by_tokens, seed=3, token_counter=count), tok
        ),
    }
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    for _ in range(rounds):
        for k, make in cases.items():
            got[k].append(rate(make(), seconds))
    return {
        k: {
            "batches_per_s": round(statistics.median(w for w, _ in v), 1),
            "batches_per_cpu_s": round(statistics.median(c for _, c in v), 1),
            "rounds_cpu": [round(c, 1) for _, c in v],
        }
        for k, v in got.items()
    }


def measure_cost() -> dict:
    from zephon_core.curriculum import token_index
    from zephon_core.curriculum.order import EpochPermutation
    from zephon_core.curriculum.token_index import DocumentTokens, TokenIndex

    n = 4_000_000
    lengths = np.random.default_rng(0).integers(1, 2000, n).astype(np.int64)
    index = TokenIndex(DocumentTokens(lengths, {"method": "exact"}), EpochPermutation(n, 1, 0), "bench")
    t0 = time.perf_counter()
    index._epoch(0)
    build_ms = (time.perf_counter() - t0) * 1e3 / (n / 1e6)
    big = [_Lengths(n, lengths, "a"), _Lengths(n // 2, lengths[: n // 2], "b")]
    static = StaticMixture(big, [0.6, 0.4], seed=1, chunk_size=64)
    staged = StagedMixture(big, [Stage({"a": 0.6, "b": 0.4}, weight_by="tokens")], seed=1, chunk_size=64)
    out = {
        "index_build_ms_per_million_documents": round(build_ms, 1),
        "index_bytes_per_epoch_per_million_documents": int(1e6 / token_index.BLOCK * 8),
    }
    for label, ws in (("static", static), ("staged_tokens", staged)):
        ws.chunks(list(range(32)))
        t0 = time.perf_counter()
        for k in range(1, 41):
            ws.chunks([k * 1000 + j for j in range(32)])
        out[f"descriptors_ms_per_32_chunks_{label}"] = round((time.perf_counter() - t0) * 1e3 / 40, 2)
    return out


class _Lengths(Source):
    """A source of ``n`` documents that only knows their lengths (descriptor and index costs read no tokens)."""

    def __init__(self, n: int, lengths: np.ndarray, name: str) -> None:
        self.name, self._n, self._len = name, n, lengths

    def __len__(self) -> int:
        return self._n

    def read(self, indices):
        raise NotImplementedError("descriptors only")

    def token_lengths(self) -> np.ndarray:
        return self._len

    def fingerprint(self) -> dict:
        return {"kind": "lengths", "documents": self._n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and rounds (a smoke run)")
    ap.add_argument("--out", default=None, help="where the JSON goes (default: bench/results/curriculum.json; "
                    "none with --quick)")
    a = ap.parse_args()
    from tokenizers import Tokenizer

    meta = corpus.build(WORK)
    paths = corpus.paths(WORK, meta)
    files = split_sources(paths)
    tok = Tokenizer.from_file(paths["tokenizer"])
    steps = 120 if a.quick else 700
    res = {
        "setup": {
            "seq_len": SEQ_LEN,
            "batch": BATCH,
            "canonical_replicas": C,
            "steps": steps,
            "weights": WEIGHTS,
            "corpus": meta["key"],
        },
        "shares": measure_shares(files, tok, steps),
        "boundary": measure_boundary(files),
        "throughput": measure_throughput(files, paths, tok, 1 if a.quick else 5, 1.0 if a.quick else 3.0),
        "cost": measure_cost(),
    }
    out = Path(a.out) if a.out else None if a.quick else ROOT / "bench" / "results" / "curriculum.json"
    if out:
        out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    emit(res)


if __name__ == "__main__":
    main()
