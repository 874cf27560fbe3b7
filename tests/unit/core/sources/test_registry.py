"""The registry of source formats (sources/registry.py) drives recipes and ``zephon index``: a format
registered in its own module is usable from a recipe and guessed from a path's suffix, with no
other edit; an unknown format or suffix is a one-line error listing the registered formats."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from support.core_fixtures import CharTokenizer, zephon_cache_dir  # noqa: F401  (autouse: a private index cache per test)

from zephon_core import ConfigError
from zephon_core.cli import main
from zephon_core.io.files import FileStat
from zephon_core.io.fs import content_fingerprint, default_name, open_fs
from zephon_core.recipe import load_recipe
from zephon_core.sources import JsonlSource, MegatronIndexedSource, ParquetSource, Source, SourceArgs, TokenArraySource
from zephon_core.sources.manifest import MANIFEST, ShardMeta
from zephon_core.sources.registry import formats, guess_format, register_format, source_format, unregister_format
from zephon_core.sources.sharded import ShardedSource


class LinesFile(Source):
    """One document per line of a text file."""

    def __init__(self, path: str) -> None:
        fs, inner = open_fs(path)
        self.name = default_name(path)
        self._lines = fs.cat_file(inner).decode().splitlines()
        self._fingerprint = {"kind": "lines", **content_fingerprint(fs, inner)}

    def __len__(self) -> int:
        return len(self._lines)

    def read(self, indices: Sequence[int]) -> list[Any]:
        return [self._lines[i] for i in indices]

    def fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)


class LinesSource(ShardedSource):
    """The whole of a new format: a class that declares itself, and its registration."""

    format_name = "lines"
    kind = "lines"
    suffixes = (".lines",)
    pretokenized = False

    def __init__(self, path: str | Sequence[str], *, name: str | None = None, access: Any = None) -> None:
        from zephon_core.io.files import Access

        self._init_files(path, name, None, access or Access())

    @classmethod
    def from_args(cls, args: SourceArgs) -> LinesSource:
        return cls(args.path, name=args.name, access=args.access)

    def open_file(self, url: str, meta: ShardMeta | None, single: bool, stat: FileStat | None = None) -> LinesFile:
        return LinesFile(url)


@pytest.fixture
def lines_format():
    register_format(LinesSource)
    yield LinesSource
    unregister_format("lines")


def _lines(folder, counts):
    folder.mkdir(parents=True, exist_ok=True)
    texts = []
    for f, n in enumerate(counts):
        docs = [f"file {f} line {i}" for i in range(n)]
        (folder / f"part-{f}.lines").write_text("".join(d + "\n" for d in docs))
        texts += docs
    return texts


def test_a_registered_format_is_usable_from_a_recipe(tmp_path, lines_format):
    texts = _lines(tmp_path / "d", [3, 4])
    recipe = tmp_path / "r.toml"
    recipe.write_text("[[sources]]\npath = 'placeholder'\n")
    r = load_recipe(recipe, overrides={"sources": [{"path": "d/", "format": "lines", "name": "web"}]})
    (src,) = r.sources()
    assert isinstance(src, LinesSource) and src.name == "web" and src.read(list(range(7))) == texts
    assert not r.pretokenized
    batch = next(iter(r.build(seq_len=8, batch_size=2, tokenizer=CharTokenizer())))
    assert batch.input_ids.shape == (2, 8) and {chr(t) for t in batch.input_ids.flat} <= set("".join(texts))
    definition = r.build(seq_len=8, batch_size=2, tokenizer=CharTokenizer()).definition()
    assert definition["work_source"]["sources"][0]["kind"] == "lines"


def test_a_registered_format_is_guessed_and_indexed_by_zephon_index(tmp_path, lines_format, capsys):
    texts = _lines(tmp_path / "d", [2, 0, 5])
    assert guess_format(str(tmp_path / "d" / "*.lines"), "pass --format") is LinesSource
    assert main(["index", str(tmp_path / "d" / "*.lines")]) == 0
    assert "3 files, 7 documents" in capsys.readouterr().out and (tmp_path / "d" / MANIFEST).exists()
    assert main(["index", str(tmp_path / "d"), "--format", "lines", "--check"]) == 0
    src = LinesSource(str(tmp_path / "d"))
    assert src.read([6, 0]) == [texts[6], texts[0]]


def test_once_unregistered_a_format_is_unknown(tmp_path, lines_format):
    unregister_format("lines")
    with pytest.raises(ConfigError, match="unknown format 'lines'"):
        source_format("lines", "here")
    register_format(LinesSource)  # for the fixture's teardown


def test_an_unknown_format_in_a_recipe_is_one_line_naming_the_field_and_the_formats(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[[sources]]\npath = 'a.csv'\nformat = 'csv'\n")
    with pytest.raises(ConfigError) as e:
        load_recipe(recipe)
    msg = str(e.value)
    assert msg.startswith(f"{recipe}: sources[0].format: unknown format 'csv'") and "\n" not in msg
    registered = [c.format_name for c in formats()]
    assert {"jsonl", "parquet", "token_array", "megatron"} <= set(registered)
    assert msg.endswith("registered formats: " + ", ".join(registered))


def test_an_unknown_suffix_is_one_line_naming_the_file_and_the_formats(tmp_path, capsys):
    with pytest.raises(ConfigError) as e:
        guess_format(str(tmp_path / "*.csv"), "pass --format")
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / '*.csv'}: no registered source format reads .csv files") and "\n" not in msg
    assert all(c.format_name in msg and all(s in msg for s in c.suffixes) for c in formats())
    assert msg.endswith("; pass --format")
    assert main(["index", str(tmp_path / "*.csv")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no registered source format reads .csv files" in err


def test_zephon_index_refuses_a_format_without_manifests(tmp_path, capsys):
    assert main(["index", str(tmp_path / "tokens.npy")]) == 1
    err = capsys.readouterr().err
    from zephon_core.cli.index import _indexable_formats

    names = [c.format_name for c in _indexable_formats()]
    assert {"jsonl", "parquet", "megatron"} <= set(names) and "token_array" not in names
    assert f"a token_array source has no manifest; zephon index writes those of {', '.join(names)} sources" in err


@pytest.mark.parametrize("path, cls", [
    ("data/*.jsonl.gz", JsonlSource), ("data/a.jsonl.zst", JsonlSource), ("data/", JsonlSource),
    ("s3://bucket/dolma", JsonlSource), ("data/*.parquet", ParquetSource), ("fineweb/part.parquet/", ParquetSource),
    ("data/a.npy", TokenArraySource), ("data/a_text_document", MegatronIndexedSource),
    ("data/*.idx", MegatronIndexedSource),
])
def test_the_bundled_formats_are_guessed_from_their_suffixes(path, cls):
    assert guess_format(path, "pass --format") is cls


def test_a_folder_with_a_dot_in_its_name_is_the_default_format(tmp_path):
    (tmp_path / "fineweb-v1.0").mkdir()
    assert guess_format(str(tmp_path / "fineweb-v1.0"), "pass --format") is JsonlSource


def test_a_name_or_suffix_registered_twice_is_refused():
    class Again(LinesSource):
        format_name = "jsonl"

    class Overlapping(LinesSource):
        suffixes = (".jsonl.gz",)

    before = [c.format_name for c in formats()]
    with pytest.raises(ValueError, match="'jsonl' is registered already"):
        register_format(Again)
    with pytest.raises(ValueError, match="'jsonl' owns .jsonl.gz already"):
        register_format(Overlapping)
    register_format(JsonlSource)  # the same class again: nothing changes
    assert [c.format_name for c in formats()] == before and "jsonl" in before
