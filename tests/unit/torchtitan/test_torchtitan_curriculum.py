"""zephon_torchtitan with a staged recipe, at loader level: it builds unchanged, and a global batch size
other than the one its step boundaries were planned with is refused before the first step."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from torchtitan.components.tokenizer import HuggingFaceTokenizer  # noqa: E402

import zephon_torchtitan as zt  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    """configs/data/curriculum.toml as a training recipe: no [standalone], absolute paths."""
    text = (ROOT / "configs" / "data" / "curriculum.toml").read_text()
    text = text[: text.index("[standalone]")].replace('"../corpus/', f'"{ROOT / "configs" / "corpus"}/')
    path = tmp_path_factory.mktemp("tt-staged") / "staged.toml"
    path.write_text(text)
    return path


def build(recipe: Path, global_batch_size: int):
    tok = HuggingFaceTokenizer(tokenizer_path=str(ROOT / "configs" / "corpus"))
    cfg = zt.ZephonDataLoader.Config(recipe=str(recipe), global_batch_size=global_batch_size)
    return cfg.build(dp_world_size=2, dp_rank=0, tokenizer=tok, seq_len=128, local_batch_size=2)


def test_a_staged_recipe_builds_and_delivers_unchanged(recipe):
    loader = build(recipe, 16)  # the recipe's global_batch_size: 16 rows, 8 batches of 2 per step
    assert "stage 2 'anneal'" in loader.pipeline.explain()
    inputs, labels = next(iter(loader))
    assert tuple(inputs["input"].shape) == (2, 128) and tuple(labels.shape) == (2, 128)


def test_another_global_batch_size_is_refused_before_the_first_step(recipe):
    with pytest.raises(ValueError, match="the recipe plans its stages with 16 rows per optimizer step, this run trains 32"):
        build(recipe, 32)
