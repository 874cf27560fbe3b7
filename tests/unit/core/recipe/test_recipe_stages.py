"""``[[stages]]`` in TOML recipes: the schema, its errors (naming file and key), and what it builds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from zephon_core import ConfigError, StagedMixture, StaticMixture
from zephon_core.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[4]
TOKENIZER = ROOT / "configs" / "corpus" / "tokenizer.json"


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(0)
    for name, n, hi in (("web", 50, 40), ("code", 30, 120), ("math", 20, 20)):
        lengths = rng.integers(1, hi, n)
        np.save(tmp_path / f"{name}.npy", rng.integers(0, 100, int(lengths.sum())).astype(np.int32))
        np.save(tmp_path / f"{name}_off.npy", np.concatenate([[0], np.cumsum(lengths)]))
    return tmp_path


SOURCES = "".join(f'[[sources]]\nname = "{n}"\npath = "{n}.npy"\nformat = "token_array"\noffsets = "{n}_off.npy"\n\n' for n in ("web", "code", "math"))
STAGES = """
[[stages]]
name = "warmup"
weights = { web = 0.9, code = 0.1 }

[[stages]]
name = "main"
start_tokens = 3000
weight_by = "tokens"
weights = { web = 0.5, code = 0.3, math = 0.2 }

[[stages]]
name = "anneal"
start_step = 100
weights = { web = 0.2, math = 0.8 }
"""


def write(folder: Path, text: str) -> Path:
    path = folder / "r.toml"
    path.write_text(text)
    return path


def test_a_staged_recipe_builds_its_schedule(corpus):
    recipe = load_recipe(write(corpus, "seed = 2\nchunk_size = 8\nglobal_batch_size = 4\n\n" + SOURCES + STAGES))
    p = recipe.build(seq_len=15, batch_size=2, global_batch_size=4)
    ws = p.work_source
    assert isinstance(ws, StagedMixture)
    assert [st.name for st in ws.stages] == ["warmup", "main", "anneal"]
    assert [st.weight_by for st in ws.stages] == ["documents", "tokens", "documents"]
    assert ws.tokens_per_step == 4 * 16  # global_batch_size rows of seq_len + 1
    main, anneal = ws.schedule.plans[1:]
    assert anneal.tokens_before >= 100 * 64 > anneal.tokens_before - main.tokens_per_chunk
    assert p.definition()["work_source"]["stages"][2]["start"] == {"step": 100, "tokens_per_step": 64}
    assert "stage 2 'anneal'" in p.explain()


def test_a_recipe_without_stages_keeps_the_static_mixture(corpus):
    text = "seed = 2\nchunk_size = 8\n\n" + SOURCES.replace('offsets = "web_off.npy"\n', 'offsets = "web_off.npy"\nweight = 2.0\n')
    ws = load_recipe(write(corpus, text)).work_source()
    assert isinstance(ws, StaticMixture) and ws.definition()["kind"] == "static_mixture" and ws.weights == [2.0, 1.0, 1.0]
    tokens = load_recipe(write(corpus, 'weight_by = "tokens"\n' + text)).work_source()
    assert isinstance(tokens, StagedMixture) and tokens.stages[0].weight_by == "tokens"
    assert tokens.stages[0].weights == {"web": 2.0, "code": 1.0, "math": 1.0}


def test_a_text_recipe_estimates_tokens_with_the_runs_tokenizer(tmp_path):
    from tokenizers import Tokenizer

    corpus = ROOT / "configs" / "corpus"
    text = (f'weight_by = "tokens"\n[[sources]]\nname = "docs"\npath = "{corpus / "stdlib_docs.jsonl"}"\n'
            f'[[sources]]\nname = "held"\npath = "{corpus / "stdlib_docs_heldout.jsonl"}"\n')
    recipe = load_recipe(write(tmp_path, text + '[[stages]]\nname = "one"\nweights = { docs = 1, held = 1 }\n'))
    p = recipe.build(seq_len=32, batch_size=2, tokenizer=Tokenizer.from_file(str(TOKENIZER)), eos_id=1)
    estimates = p.definition()["work_source"]["token_estimates"]
    assert {e["method"] for e in estimates.values()} == {"bytes"}
    with pytest.raises(ConfigError, match="text sources need a tokenizer"):
        recipe.build(seq_len=32, batch_size=2)


@pytest.mark.parametrize(
    "text,match",
    [
        (SOURCES.replace('name = "web"\n', 'name = "web"\nweight = 2\n') + STAGES,
         r"sources\[0\].weight: with \[\[stages\]\], weights are given per stage"),
        (SOURCES.replace('name = "code"\n', "") + STAGES, r"sources\[1\].name: with \[\[stages\]\], every source needs a name"),
        (SOURCES + STAGES.replace('name = "main"\n', ""), r"stages\[1\].name: .*missing"),
        (SOURCES + STAGES.replace("weights = { web = 0.9, code = 0.1 }", "weights = { web = 0.9, cod = 0.1 }"),
         r"stages\[0\] \('warmup'\).weights: unknown source 'cod'; did you mean 'code'\?"),
        (SOURCES + STAGES.replace("start_tokens = 3000", "start_token = 3000"), r"stages\[1\].start_token"),
        (SOURCES + STAGES.replace('weight_by = "tokens"', 'weight_by = "token"'), r"weight_by must be one of \('documents', 'tokens'\), got 'token'"),
        (SOURCES + STAGES, r"stages\[2\].start_step: converting steps to tokens needs global_batch_size"),
        ('weight_by = "bytes"\n' + SOURCES, r"weight_by must be one of"),
        ("stages = 3\n" + SOURCES, r"stages: must be an array of tables, written \[\[stages\]\]"),
        (SOURCES + STAGES.replace("start_tokens = 3000", "start_tokens = 3000\nstart_step = 9"), r"stages\[1\] \('main'\): give exactly one of"),
    ],
)
def test_stage_mistakes_name_the_file_and_the_key(corpus, text, match):
    path = write(corpus, text if "start_step: converting" in match else "global_batch_size = 4\n" + text)
    with pytest.raises(ConfigError, match=match) as e:
        load_recipe(path)
    assert str(path) in str(e.value)


def test_the_framework_batch_size_must_be_the_one_the_stages_were_planned_with(corpus):
    recipe = load_recipe(write(corpus, "global_batch_size = 4\n" + SOURCES + STAGES))
    with pytest.raises(ConfigError, match="the recipe plans its stages with 4 rows per optimizer step, this run trains 8"):
        recipe.build(seq_len=15, batch_size=2, global_batch_size=8)
    with pytest.raises(ConfigError, match="start_step boundaries need the sequence length"):
        recipe.work_source()
