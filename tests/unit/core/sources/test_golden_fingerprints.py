"""Data definitions pinned: the fingerprint of a pipeline over every format (one file and many: their
fingerprints differ) and over every bundled recipe, and the state after its first batch, as recorded before
the formats were refactored onto one per-file template (issue #33). A change here changes what a checkpoint
restores into: it must be a deliberate, versioned change of the data definition, never a side effect.

The corpora are committed (golden/, written once by golden/make_fixtures.py), so their bytes never depend on
the versions of the libraries that wrote them. ``python tests/unit/core/sources/test_golden_fingerprints.py``
prints the current values in golden/fingerprints.json's layout.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from zephon_core import Pipeline, StaticMixture
from zephon_core.checkpoint.state import fingerprint_of
from zephon_core.io.files import Access
from zephon_core.lane.tokenizer_file import load_tokenizer
from zephon_core.recipe import load_recipe
from zephon_core.sources.registry import SourceArgs, source_format

HERE = Path(__file__).resolve().parent / "golden"
ROOT = Path(__file__).resolve().parents[4]
TOKENIZER = ROOT / "configs" / "corpus" / "tokenizer.json"
# (case, format, path under golden/, text_field, offsets)
FORMATS = [
    ("jsonl", "jsonl", "jsonl", "text", None),
    ("jsonl:file", "jsonl", "jsonl/part-1.jsonl.gz", "text", None),
    ("parquet", "parquet", "parquet", "text", None),
    ("parquet:file", "parquet", "parquet/part-1.parquet", "text", None),
    ("arrow", "arrow", "arrow", "text", None),
    ("arrow:file", "arrow", "arrow/data-00001-of-00002.arrow", "text", None),
    ("webdataset", "webdataset", "webdataset", "txt", None),
    ("webdataset:file", "webdataset", "webdataset/part-1.tar", "txt", None),
    ("mds", "mds", "mds", "text", None),
    ("mds_tokens", "mds_tokens", "mds_tokens", "tokens", None),
    ("token_array", "token_array", "token_array/tokens.npy", "text", "token_array/offsets.npy"),
    ("megatron", "megatron", "megatron", "text", None),
    ("megatron:file", "megatron", "megatron/part-1_text_document", "text", None),
]
RECIPES = sorted(p.name for p in (ROOT / "configs" / "data").glob("*.toml"))
OPTIONS = {"canonical_replicas": 2, "dp_degree": 1, "dp_group_id": 0, "prefetch": 0}


def pinned(p: Pipeline) -> dict[str, str]:
    """The pipeline's fingerprint and a digest of its state after one batch."""
    next(iter(p))
    state = json.dumps(p.checkpoint(), sort_keys=True)
    digest = hashlib.blake2b(state.encode(), digest_size=16).hexdigest()
    return {"fingerprint": fingerprint_of(p.definition()), "state": digest}


def format_case(case: str, cache: Path) -> dict[str, str]:
    _, fmt, path, field, offsets = next(f for f in FORMATS if f[0] == case)
    cls = source_format(fmt, "format")
    args = SourceArgs(str(HERE / path), text_field=field, offsets=None if offsets is None else str(HERE / offsets),
                      access=Access(cache_dir=str(cache)))
    p = Pipeline(StaticMixture([cls.from_args(args)], seed=3, chunk_size=4))
    if not cls.pretokenized:
        p = p.tokenize(load_tokenizer(str(TOKENIZER), "tokenizer"), eos_id=1)
    return pinned(p.pack(seq_len=16).shuffle(window=2, seed=5).batch(2).options(**OPTIONS))


def megatron_recipe(folder: Path) -> Path:
    """mg_indexed.toml reads the corpus configs/megatron/make_indexed_corpus.py writes: written here, beside a copy."""
    data = folder / "megatron" / "data"
    data.mkdir(parents=True)
    subprocess.run([sys.executable, str(ROOT / "configs" / "megatron" / "make_indexed_corpus.py"),
                    "--out", str(data / "stdlib_docs_text_document")], check=True, capture_output=True)
    (folder / "data").mkdir()
    shutil.copy(ROOT / "configs" / "data" / "mg_indexed.toml", folder / "data" / "mg_indexed.toml")
    return folder / "data" / "mg_indexed.toml"


def recipe_case(name: str, folder: Path) -> dict[str, str]:
    path = megatron_recipe(folder) if name == "mg_indexed.toml" else ROOT / "configs" / "data" / name
    recipe = load_recipe(path)
    if recipe.spec.standalone is not None:
        return pinned(recipe.build_standalone(**OPTIONS))
    tokenizer = None if recipe.pretokenized else load_tokenizer(str(TOKENIZER), "tokenizer")
    gbs = recipe.spec.global_batch_size
    return pinned(recipe.build(seq_len=32, batch_size=gbs or 2, tokenizer=tokenizer, eos_id=1, global_batch_size=gbs,
                               **OPTIONS))


def golden() -> dict[str, Any]:
    return json.loads((HERE / "fingerprints.json").read_text())


@pytest.mark.parametrize("case", [f[0] for f in FORMATS])
def test_every_format_keeps_its_fingerprint_and_state(case, tmp_path):
    assert format_case(case, tmp_path) == golden()["formats"][case]


@pytest.mark.parametrize("name", RECIPES)
def test_every_bundled_recipe_keeps_its_fingerprint_and_state(name, tmp_path):
    assert recipe_case(name, tmp_path) == golden()["recipes"][name]


def test_every_format_and_recipe_is_pinned():
    assert sorted(golden()["formats"]) == sorted(f[0] for f in FORMATS) and sorted(golden()["recipes"]) == RECIPES


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = {"formats": {c[0]: format_case(c[0], Path(tmp) / "cache") for c in FORMATS},
               "recipes": {r: recipe_case(r, Path(tempfile.mkdtemp(dir=tmp))) for r in RECIPES}}
    print(json.dumps(out, indent=1, sort_keys=True))
