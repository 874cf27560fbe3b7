"""Each framework's conventions are declared once (``integration.frameworks``, registered as ``zephon.frameworks``
entry points) and a checkpoint's definition is matched against them (issue #42): the same answer as the guess they
replace for the runs the bundled recipes make, and a definition matching none or several is refused in one line."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from zephon_core.errors import ConfigError
from zephon_core.integration.frameworks import MEGATRON, TORCHTITAN, FrameworkConventions, framework_of, registered
from zephon_core.recipe import load_recipe
from zephon_core.verify.shape import Shape, build

ROOT = Path(__file__).resolve().parents[4]
CORPUS = ROOT / "configs" / "corpus"


def _definition(recipe: str, framework: str) -> dict:
    p = build(load_recipe(ROOT / "configs" / "data" / recipe), Shape(str(CORPUS), 64, 2, framework), prefetch=0)
    next(iter(p))
    return p.checkpoint()["definition"]


def _tokenize(definition: dict) -> dict:
    return next(op for op in definition["ops"] if op["op"] == "tokenize")


def test_the_adapters_conventions_are_registered_as_entry_points_not_imported():
    assert registered() == {"torchtitan": TORCHTITAN, "megatron": MEGATRON}


@pytest.mark.parametrize("recipe", ["tt_train.toml", "tt_heldout.toml", "mg_train.toml", "mg_heldout.toml"])
@pytest.mark.parametrize("framework", ["torchtitan", "megatron"])
def test_a_runs_definition_names_the_framework_that_built_it(recipe, framework):
    definition = _definition(recipe, framework)
    assert framework_of(definition) == framework
    # The guess it replaces: BOS before each document is TorchTitan's, else Megatron's.
    assert framework == ("torchtitan" if _tokenize(definition).get("bos_id") is not None else "megatron")


def test_a_pretokenized_definition_has_no_tokenization_to_match_and_answers_as_before():
    definition = copy.deepcopy(_definition("tt_train.toml", "megatron"))
    definition["ops"] = [op for op in definition["ops"] if op["op"] != "tokenize"]
    assert framework_of(definition) == "megatron"


def _one_line_refusal(definition: dict, frameworks: dict | None = None) -> str:
    with pytest.raises(ConfigError) as e:
        framework_of(definition, frameworks)
    msg = str(e.value)
    assert "\n" not in msg and "pass --framework" in msg, msg
    return msg


def test_a_definition_no_framework_tokenizes_as_is_refused_in_one_line():
    definition = copy.deepcopy(_definition("tt_train.toml", "torchtitan"))
    _tokenize(definition)["eos_id"] = None  # BOS alone: neither TorchTitan's BOS and EOS nor Megatron's EOD only
    assert "matches 0 frameworks' conventions (no registered framework tokenizes so)" in _one_line_refusal(definition)


def test_a_definition_two_frameworks_tokenize_as_is_refused_in_one_line():
    definition = _definition("tt_train.toml", "megatron")
    twin = FrameworkConventions("megatwin", bos=False, eos=True, seq_len=None, batch_size=None, seq_len_flag="",
                                batch_size_flag="", tokenizer_flag="")
    msg = _one_line_refusal(definition, {"megatron": MEGATRON, "megatwin": twin, "torchtitan": TORCHTITAN})
    assert "matches 2 frameworks' conventions (megatron and megatwin all tokenize so)" in msg, msg
