"""The Megatron recipes and example launches in configs/ are valid."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from zephon_core.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "configs" / "data"
MEGATRON = ROOT / "configs" / "megatron"


@pytest.mark.parametrize("name", ["mg_train", "mg_heldout", "mg_indexed"])
def test_recipes_load_and_leave_sizes_to_megatron(name):
    r = load_recipe(DATA / f"{name}.toml")
    assert r.spec.standalone is None  # Megatron supplies tokenizer, sequence length and batch size
    assert r.pretokenized == (name == "mg_indexed")


def test_text_recipe_builds_with_a_megatron_style_tokenizer():
    from zephon_megatron.tokenizer import TokenizerAdapter

    class Words:
        """Stands in for Megatron's tokenizer object: tokenize(text) -> ids."""

        def tokenize(self, text):
            return [len(w) % 50 for w in text.split()]

    p = load_recipe(DATA / "mg_train.toml").build(seq_len=64, batch_size=2, tokenizer=TokenizerAdapter(Words()), eos_id=1,
                                                 dp_degree=4, dp_group_id=3)
    b = next(iter(p))
    assert b.input_ids.shape == (2, 64) and b.lane in p.identity.lanes and len(p.identity.lanes) == 2


def test_make_indexed_corpus_writes_what_mg_indexed_reads(tmp_path):
    pytest.importorskip("megatron.core.datasets.indexed_dataset")
    pytest.importorskip("tokenizers")
    spec = importlib.util.spec_from_file_location("make_indexed_corpus", MEGATRON / "make_indexed_corpus.py")
    make_indexed_corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_indexed_corpus)  # the script as a user runs it, by path
    prefix = tmp_path / "corpus_text_document"
    assert make_indexed_corpus.main(["--out", str(prefix)]) == 0
    r = load_recipe(DATA / "mg_indexed.toml", overrides={"sources": [{"path": str(prefix), "format": "megatron"}]})
    (src,) = r.sources()
    with open(ROOT / "configs" / "corpus" / "stdlib_docs.jsonl") as f:
        assert len(src) == sum(1 for line in f if line.strip())
    assert all(doc[-1] == 1 for doc in src.read([0, 1, len(src) - 1]))  # EOD appended
    b = next(iter(r.build(seq_len=32, batch_size=2, dp_degree=2, dp_group_id=1)))
    assert b.input_ids.shape == (2, 32)


def test_example_launch_flags_parse_with_megatron():
    pytest.importorskip("megatron.training.arguments")
    out = subprocess.run(
        ["bash", "-c", f'MEGATRON_LM=/x source "{MEGATRON / "common.sh"}"; printf "%s\\n" "${{MODEL_FLAGS[@]}}" "${{ZEPHON_FLAGS[@]}}"'],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    code = (
        "import sys, json; import zephon_megatron; zephon_megatron.install();"
        "import megatron.training.arguments as a;"
        "sys.argv = ['x', '--dataloader-type', 'zephon'] + json.loads(sys.stdin.read());"
        "ns = a.parse_args(); print(ns.dataloader_type, ns.zephon_recipe is not None, ns.dataloader_save is not None)"
    )
    import json

    res = subprocess.run([sys.executable, "-c", code], input=json.dumps(out), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "zephon True True"
