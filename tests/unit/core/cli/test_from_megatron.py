"""``zephon from-megatron``: Megatron's ``--data-path`` read as megatron-core reads it (its own parser is the
oracle), a recipe that reads the same ``.bin``/``.idx`` pairs with the blend's weights as token shares, and
bad lists refused in one line."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest
from support.core_fixtures import zephon_cache_dir  # noqa: F401  (autouse: a private cache per test)

from zephon_core import ConfigError
from zephon_core.cli import build_parser, main
from zephon_core.cli.from_megatron import parse_blend
from zephon_core.recipe import load_recipe

torch = pytest.importorskip("torch")
blend_utils = pytest.importorskip("megatron.core.datasets.utils")
indexed_dataset = pytest.importorskip("megatron.core.datasets.indexed_dataset")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


@pytest.mark.parametrize("words", [
    ["/d/a_text_document"],
    ["/d/a_text_document", "/d/b_text_document"],
    ["/d/a", "/d/b", "/d/c"],
    ["0.7", "/d/a", "0.3", "/d/b"],
    ["30", "/d/a", "70", "/d/b"],
    ["1e-1", "s3://bucket/a", "9e-1", "s3://bucket/b"],
    ["/d/a", "0.5", "/d/b", "0.5"],  # even, but not weight-prefix pairs: prefixes
])
def test_a_blend_list_reads_as_megatron_core_reads_it(words):
    prefixes, weights = parse_blend(words, "--data-path")
    theirs = blend_utils.get_blend_from_list(words)
    assert (prefixes, weights) == (list(theirs[0]), None if theirs[1] is None else list(theirs[1]))


def _pair(prefix: Path, lengths: list[int], token: int) -> None:
    builder = indexed_dataset.IndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.int32)
    for n in lengths:
        builder.add_document(torch.full((n,), token, dtype=torch.int32), [n])
    builder.finalize(str(prefix) + ".idx")


def test_a_weighted_blend_becomes_a_recipe_whose_token_shares_are_the_weights(tmp_path, capsys):
    _pair(tmp_path / "short_text_document", [5 + d % 7 for d in range(400)], token=1)
    _pair(tmp_path / "long_text_document", [40 + d % 30 for d in range(400)], token=2)
    out = tmp_path / "blend.toml"
    assert main(["from-megatron", "--data-path", "3", str(tmp_path / "short_text_document"),
                 "1", str(tmp_path / "long_text_document"), "--out", str(out)]) == 0
    assert "2 Megatron prefix(es) with their weights" in capsys.readouterr().out
    spec = tomllib.loads(out.read_text())
    assert spec["weight_by"] == "tokens" and spec["seed"] == 1234
    assert [(s["format"], s["weight"]) for s in spec["sources"]] == [("megatron", 0.75), ("megatron", 0.25)]
    counts = np.zeros(3, dtype=np.int64)
    with load_recipe(out).build(seq_len=64, batch_size=4, canonical_replicas=1, prefetch=0) as p:
        for _, batch in zip(range(150), p):
            counts += np.bincount(np.asarray(batch.input_ids).reshape(-1), minlength=3)[:3]
    share = counts[1] / (counts[1] + counts[2])
    assert abs(share - 0.75) < 0.03, f"the first prefix's token share is {share:.3f}, the blend says 0.75"


def test_prefixes_alone_are_one_source_of_every_document_and_a_file_holds_the_list(tmp_path, capsys):
    for name in ("a", "b"):
        _pair(tmp_path / f"{name}_text_document", [3, 4, 5], token=1)
    listing = tmp_path / "data_args.txt"
    listing.write_text(f"{tmp_path / 'a_text_document'}\n{tmp_path / 'b_text_document'}\n")
    assert main(["from-megatron", "--data-args-path", str(listing)]) == 0
    spec = tomllib.loads(capsys.readouterr().out)
    assert "weight_by" not in spec and len(spec["sources"]) == 1
    assert spec["sources"][0]["paths"] == [str(tmp_path / "a_text_document"), str(tmp_path / "b_text_document")]
    assert main(["from-megatron", "--data-args-path", str(listing), "--out", str(tmp_path / "r.toml")]) == 0
    recipe = load_recipe(tmp_path / "r.toml")
    assert len(recipe.sources()[0]) == 6


@pytest.mark.parametrize("argv,message", [
    (["--data-path", "0.5", "/d/a.bin", "0.5", "/d/b"],
     "'/d/a.bin' names a file; a Megatron prefix has no suffix: '/d/a'"),
    (["--data-path", "0", "/d/a", "1", "/d/b"], "blend weights must be positive numbers, got '0' (for /d/a)"),
    ([], "pass exactly one of --data-path and --data-args-path"),
    (["--data-args-path", "/nonexistent/list.txt"], "/nonexistent/list.txt: cannot read it"),
])
def test_a_bad_list_is_one_line_naming_what_to_change(argv, message, capsys):
    assert main(["from-megatron", *argv]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_an_existing_recipe_is_not_overwritten_without_force(tmp_path):
    out = tmp_path / "r.toml"
    out.write_text("# mine\n")
    args = build_parser().parse_args(["from-megatron", "--data-path", "/d/a", "--out", str(out)])
    with pytest.raises(ConfigError, match="already exists; pass --force"):
        args.fn(args)
    assert out.read_text() == "# mine\n"
    assert main(["from-megatron", "--data-path", "/d/a", "--out", str(out), "--force"]) == 0
    assert 'path = "/d/a"' in out.read_text()
