"""zephon_core.recipe: TOML data recipes, strictly validated."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from support.core_fixtures import CharTokenizer, take, write_jsonl, zephon_cache_dir  # noqa: F401  (autouse fixture)

from zephon_core import ConfigError, JsonlSource, TokenArraySource
from zephon_core.recipe import load_recipe

REPO = Path(__file__).resolve().parents[4]
DEMO = REPO / "configs" / "data" / "demo.toml"


@pytest.fixture
def project(tmp_path):
    """A recipe folder with its data in a sibling folder, referenced relatively."""
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "a.jsonl", [{"text": f"alpha {i} " * (1 + i % 4)} for i in range(40)])
    write_jsonl(data / "b.jsonl", [{"body": f"beta {i}"} for i in range(30)])
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    return tmp_path


def _write(folder: Path, body: str, name="r.toml") -> Path:
    path = folder / name
    path.write_text(body)
    return path


GOOD = """
seed = 5
chunk_size = 8
canonical_replicas = 4

[[sources]]
path = "../data/a.jsonl"
weight = 0.75

[[sources]]
path = "../data/b.jsonl"
text_field = "body"
name = "beta"
weight = 0.25

[shuffle]
window = 4
seed = 3

[aggregate]
dir = "../agg"
run_id = "recipe-run"
"""


def test_relative_paths_resolve_from_the_recipe_folder(project, monkeypatch):
    path = _write(project / "recipes", GOOD)
    monkeypatch.chdir(project / "data")  # somewhere else entirely
    recipe = load_recipe(path)
    sources = recipe.sources()
    assert [type(s) for s in sources] == [JsonlSource, JsonlSource]
    assert sources[0].path == str((project / "data" / "a.jsonl").resolve())
    assert sources[1].name == "beta" and sources[1].read([3]) == ["beta 3"]
    ws = recipe.work_source()
    assert ws.seed == 5 and ws.chunk_size == 8 and ws.counts == [6, 2]
    p = recipe.build(seq_len=16, batch_size=2, tokenizer=CharTokenizer(), dp_degree=2, dp_group_id=1, prefetch=0)
    assert p.identity.canonical_replicas == 4 and p.identity.lanes == [2, 3]
    assert p._opts.aggregate_dir == str((project / "agg").resolve())
    assert p._opts.run_id == "recipe-run"
    assert [op["op"] for op in p.definition()["ops"]] == ["tokenize", "pack", "shuffle", "batch"]
    b = take(p, 1)[0]
    assert b.input_ids.shape == (2, 16)


def test_absolute_paths_are_kept(project):
    body = f'[[sources]]\npath = "{project / "data" / "a.jsonl"}"\n'
    recipe = load_recipe(_write(project / "recipes", body))
    assert recipe.sources()[0].path == str(project / "data" / "a.jsonl")


def test_options_override_recipe_defaults(project):
    recipe = load_recipe(_write(project / "recipes", GOOD))
    p = recipe.build(seq_len=8, batch_size=1, tokenizer=CharTokenizer(), canonical_replicas=8, run_id="other", prefetch=0)
    assert p.identity.canonical_replicas == 8 and p._opts.run_id == "other"


def test_overrides_merge_over_the_file(project):
    recipe = load_recipe(_write(project / "recipes", GOOD), overrides={"seed": 11, "shuffle": {"window": 0}})
    assert recipe.spec.seed == 11
    p = recipe.build(seq_len=8, batch_size=1, tokenizer=CharTokenizer())
    assert "shuffle" not in [op["op"] for op in p.definition()["ops"]]


def test_text_recipe_needs_a_tokenizer(project):
    recipe = load_recipe(_write(project / "recipes", GOOD))
    with pytest.raises(ConfigError, match="tokenizer"):
        recipe.build(seq_len=8, batch_size=1)
    with pytest.raises(ConfigError, match="standalone"):
        recipe.build_standalone()


def test_token_array_recipe(tmp_path):
    docs = [np.arange(d * 10, d * 10 + 3 + d % 4) for d in range(20)]
    np.save(tmp_path / "tok.npy", np.concatenate(docs).astype(np.int32))
    np.save(tmp_path / "off.npy", np.concatenate([[0], np.cumsum([len(d) for d in docs])]))
    body = '[[sources]]\npath = "tok.npy"\nformat = "token_array"\noffsets = "off.npy"\n[standalone]\nseq_len = 6\nbatch_size = 2\n'
    recipe = load_recipe(_write(tmp_path, body))
    assert recipe.pretokenized
    src = recipe.sources()[0]
    assert isinstance(src, TokenArraySource) and src.read([5])[0].tolist() == docs[5].tolist()
    b = take(recipe.build_standalone(prefetch=0), 1)[0]
    assert b.input_ids.shape == (2, 6)


def test_demo_recipe_builds_and_runs():
    recipe = load_recipe(DEMO)
    src = recipe.sources()[0]
    assert Path(src.path) == (REPO / "configs" / "corpus" / "stdlib_docs.jsonl").resolve()
    p = recipe.build_standalone(dp_degree=4, dp_group_id=1, prefetch=0)
    assert p.identity.canonical_replicas == 8 and p.identity.lanes == [2, 3]
    b = take(p, 1)[0]
    assert b.input_ids.shape == (2, 128)
    assert b.lane == 2


# -- errors -----------------------------------------------------------------------
def _error(folder, body):
    path = _write(folder, body)
    with pytest.raises(ConfigError) as e:
        load_recipe(path).sources()
    return str(path), str(e.value)


SRC = '[[sources]]\npath = "a.jsonl"\n'


@pytest.mark.parametrize(
    "body, key",
    [
        ("sed = 1\n" + SRC, "sed"),
        (SRC + "[shuffle]\nwndow = 2\n", "wndow"),
        ("seed = 'x'\n" + SRC, "seed"),
        ("chunk_size = 2.5\n" + SRC, "chunk_size"),
        (SRC + "[shuffle]\nwindow = 'big'\n", "shuffle.window"),
        ("chunk_size = 0\n" + SRC, "chunk_size"),
        ("canonical_replicas = 0\n" + SRC, "canonical_replicas"),
        ("exhausted = 'loop'\n" + SRC, "exhausted"),
        ("pack_mode = 'bins'\n" + SRC, "pack_mode"),
        (SRC + "[execution]\nparallelism = 0\n", "execution.parallelism"),
        (SRC + "[standalone]\nseq_len = 0\n", "standalone.seq_len"),
        (SRC + "weight = 0\n", "sources[0].weight"),
        (SRC + "weight = -2.0\n", "sources[0].weight"),
        (SRC + "weight = nan\n", "sources[0].weight"),
        (SRC + "weight = inf\n", "sources[0].weight"),
        (SRC + "format = 'csv'\n", "sources[0].format"),
        (SRC + "format = 'token_array'\n", "sources[0].offsets"),
        ("seed = 1\n", "sources"),
        ("[[sources]]\nformat = 'jsonl'\n", "sources[0].path"),
        (SRC + SRC + "format = 'megatron'\n", "sources"),  # text and tokens mixed
    ],
    ids=lambda v: v if "\n" not in v else None,
)
def test_errors_name_the_file_and_the_key(tmp_path, body, key):
    path, msg = _error(tmp_path, body)
    assert msg.startswith(path + ":"), msg
    assert key in msg, msg


@pytest.mark.parametrize(
    "body, key",
    [
        (SRC + SRC + "weight = 'heavy'\n", "sources[1].weight"),
        (SRC + SRC + "wieght = 1.0\n", "sources[1].wieght"),
    ],
    ids=["wrong-type", "unknown-key"],
)
def test_errors_inside_a_source_name_which_source(tmp_path, body, key):
    """With several [[sources]], the message must say which one is wrong."""
    path, msg = _error(tmp_path, body)
    assert msg.startswith(path + ":"), msg
    assert key in msg, msg


def test_unknown_key_suggests_the_right_one(tmp_path):
    _, msg = _error(tmp_path, "sed = 1\n" + SRC)
    assert "seed" in msg


def test_invalid_toml_and_missing_file(tmp_path):
    path, msg = _error(tmp_path, "seed = = 1\n")
    assert path in msg and "TOML" in msg
    with pytest.raises(ConfigError) as e:
        load_recipe(tmp_path / "absent.toml")
    assert "absent.toml" in str(e.value)


def test_missing_data_file_names_it(tmp_path):
    path = _write(tmp_path, '[[sources]]\npath = "nope.jsonl"\n')
    with pytest.raises(Exception) as e:
        load_recipe(path).sources()
    assert "nope.jsonl" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_standalone_text_recipe_needs_a_tokenizer_file(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    recipe = load_recipe(_write(tmp_path, SRC + "[standalone]\nseq_len = 4\n"))
    with pytest.raises(ConfigError, match="standalone.tokenizer"):
        recipe.build_standalone()
    assert os.path.exists(tmp_path / "a.jsonl")


def test_recipe_fit_packing_options(project):
    body = GOOD.replace("canonical_replicas = 4", 'canonical_replicas = 4\npack_mode = "best_fit"\npack_window = 16\n'
                        'pack_overlong = "truncate"\nmax_docs_per_row = 3')
    p = load_recipe(_write(project / "recipes", body)).build(seq_len=8, batch_size=1, tokenizer=CharTokenizer(), prefetch=0)
    pack = next(op for op in p.definition()["ops"] if op["op"] == "pack")
    assert pack == {"op": "pack", "seq_len": 8, "mode": "best_fit", "pad_id": 0, "window": 16, "overlong": "truncate",
                    "max_docs_per_row": 3}
    bad = GOOD.replace("canonical_replicas = 4", 'canonical_replicas = 4\npack_window = 16')
    with pytest.raises(ConfigError, match=r"r\.toml: pack: window is an option of the fit modes"):
        load_recipe(_write(project / "recipes", bad))
