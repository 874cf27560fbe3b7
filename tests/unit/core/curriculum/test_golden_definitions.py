"""Fingerprints, definitions and states pinned byte for byte (issue #33: one typed definition, one mixture).

Every bundled recipe and a set of static and staged mixtures (document and token weights, several
stages, both exhaustion policies, file order, block shuffle) are built, run for a few batches and
checkpointed; ``golden_definitions.json`` holds what they gave before the mixtures shared a base and
the definition one parser. A refactor of the curriculum or of the definition's readers must not
change a byte of it. ``ZEPHON_WRITE_GOLDEN=1`` rewrites the file: only for a deliberate, versioned
change of the data definition.

``mg_indexed.toml`` is left out: its data is written by Megatron-LM's own tools (not in the repository).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from support.core_fixtures import CharTokenizer, token_source, write_jsonl

from zephon_core import JsonlSource, MemorySource, Pipeline, Stage, StagedMixture, StaticMixture
from zephon_core.checkpoint.state import canonical_json, fingerprint_of
from zephon_core.lane.docops import token_counter
from zephon_core.lane.tokenizer_file import load_tokenizer
from zephon_core.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[4]
GOLDEN = Path(__file__).with_name("golden_definitions.json")
RECIPES = ["curriculum", "curriculum_main", "demo", "mg_heldout", "mg_train", "tt_heldout", "tt_train"]
C, BATCHES = 4, 3


def _recipe(name: str) -> Pipeline:
    recipe = load_recipe(ROOT / "configs" / "data" / f"{name}.toml")
    if recipe.spec.standalone is not None:
        return recipe.build_standalone(canonical_replicas=C, prefetch=0)
    tokenizer = load_tokenizer(str(ROOT / "configs" / "corpus" / "tokenizer.json"))
    return recipe.build(seq_len=64, batch_size=2, tokenizer=tokenizer, eos_id=1, canonical_replicas=C, prefetch=0)


def _sources(sizes=(37, 11, 53)) -> list[MemorySource]:
    return [token_source(n, s, name=f"s{s}") for s, n in enumerate(sizes)]


def _text_sources(folder: Path) -> list[JsonlSource]:
    out = []
    for s, (name, n) in enumerate([("s0", 29), ("s1", 17), ("text", 41)]):
        docs = [{"text": "abcdefgh"[: 1 + (d + s) % 8] * (1 + d % (3 + s))} for d in range(n)]
        out.append(JsonlSource(str(write_jsonl(folder / f"{name}.jsonl", docs)), name=name))
    return out


def _static(**kw: Any):
    return lambda folder: StaticMixture(_sources(), kw.pop("weights", [0.5, 0.2, 0.3]), **kw)


def _staged(stages: list[Stage], text: bool = False, **kw: Any):
    def make(folder: Path) -> StagedMixture:
        sources = _text_sources(folder) if text else _sources()
        counter = token_counter(CharTokenizer(), eos_id=1) if text else None
        return StagedMixture(sources, stages, token_counter=counter, **kw)
    return make


THREE = [
    Stage({"s0": 1, "s1": 1}, name="warm"),
    Stage({"s1": 1, "s2": 3}, name="main", start_chunk=7, weight_by="tokens"),
    Stage({"s0": 2, "s2": 1}, name="anneal", start_chunk=42),
]
MIXTURES = {
    "static_default": _static(),
    "static_equal": _static(weights=None, seed=9, chunk_size=10),
    "static_stop": _static(exhausted="stop", seed=2, chunk_size=16),
    "static_file_order": _static(shuffle=False, chunk_size=7),
    "static_blocks": _static(block_size=4, block_window=3, seed=5),
    "static_int_weights": _static(weights=[3, 1, 2], seed=11, chunk_size=12),
    "staged_one_stage": _staged([Stage({"s0": 0.5, "s1": 0.2, "s2": 0.3})], seed=4, chunk_size=16),
    "staged_three": _staged(THREE, seed=3, chunk_size=8),
    "staged_three_stop": _staged(THREE, seed=3, chunk_size=8, exhausted="stop"),
    "staged_blocks": _staged(THREE, seed=6, chunk_size=8, block_size=3, block_window=2),
    "staged_file_order": _staged(THREE, seed=6, chunk_size=8, shuffle=False),
    "staged_token_starts": _staged(
        [Stage({"s0": 1, "s2": 1}, name="a"), Stage({"s0": 1, "s1": 2}, name="b", start_tokens=900, weight_by="tokens"),
         Stage({"s1": 1, "s2": 1}, name="c", start_step=40, weight_by="tokens")],
        seed=8, chunk_size=8, tokens_per_step=34),
    "staged_text_tokens": _staged(
        [Stage({"s0": 1, "text": 1}, name="a", weight_by="tokens"),
         Stage({"s1": 1, "text": 2}, name="b", start_tokens=500, weight_by="tokens")], text=True, seed=1, chunk_size=8),
}


def _mixture_pipeline(ws: Any) -> Pipeline:
    p = Pipeline(ws)
    if any(isinstance(s, JsonlSource) for s in ws.sources):
        p = p.tokenize(CharTokenizer(), eos_id=1)
    return p.pack(16).shuffle(4, seed=2).batch(2).options(canonical_replicas=C, prefetch=0)


def _record(p: Pipeline) -> dict[str, Any]:
    definition = p.definition()
    it = iter(p)
    batches = [next(it) for _ in range(BATCHES)]
    state = p.checkpoint()
    p.close()
    return {
        "fingerprint": fingerprint_of(definition),
        "definition": json.loads(canonical_json(definition)),
        "batches": [b.digest for b in batches],
        "state": canonical_json(state),
    }


def _cases(folder: Path) -> dict[str, Any]:
    out: dict[str, Any] = {f"recipe:{name}": (lambda name=name: _recipe(name)) for name in RECIPES}
    for name, make in MIXTURES.items():
        out[f"mixture:{name}"] = lambda make=make: _mixture_pipeline(make(folder))
    return out


def test_golden_values_are_recorded_for_every_case():
    if not GOLDEN.exists() and os.environ.get("ZEPHON_WRITE_GOLDEN"):
        pytest.skip("being written")
    assert sorted(json.loads(GOLDEN.read_text())) == sorted(_cases(Path(".")))


@pytest.mark.parametrize("case", sorted(_cases(Path("."))))
def test_fingerprint_definition_and_state_are_byte_identical(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the text source's path is relative: the same in every run
    got = _record(_cases(Path("."))[case]())
    if os.environ.get("ZEPHON_WRITE_GOLDEN"):
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        golden[case] = got
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        return
    want = json.loads(GOLDEN.read_text())[case]
    assert got["definition"] == want["definition"]
    assert got["fingerprint"] == want["fingerprint"]
    assert got["batches"] == want["batches"]
    assert got["state"] == want["state"]
