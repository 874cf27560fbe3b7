"""A recipe's ``[surgery]`` table (issue #35): the one way both adapters are told to skip steps or quarantine
documents. It is journaled once into the restored pipeline, left alone once journaled (so it may stay in the recipe
for the rest of the run), refused naming the key where it cannot hold, and never part of the data's fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zephon_core.checkpoint.surgery import surgery_journal_of
from zephon_core.errors import ConfigError, StateError
from zephon_core.pipeline.surgery import apply_surgery
from zephon_core.recipe import load_recipe

DEMO = Path(__file__).resolve().parents[4] / "configs" / "data" / "demo.toml"
C = 8


def _recipe(tmp_path: Path, surgery: str):
    text = DEMO.read_text().replace('"../corpus/', f'"{DEMO.parent.parent / "corpus"}/')
    path = tmp_path / "r.toml"
    path.write_text(text + surgery)
    return load_recipe(path)


def _resumed(tmp_path: Path, steps: int, surgery: str):
    """The recipe with ``surgery`` and its pipeline restored from the plain recipe's state after ``steps`` steps."""
    first = _recipe(tmp_path, "").build_standalone()
    _steps(first, steps)
    recipe = _recipe(tmp_path, surgery)
    p = recipe.build_standalone()
    p.restore(json.loads(json.dumps(first.checkpoint())))
    return recipe, p


def _steps(pipeline, n: int, B: int = C) -> list[list[str]]:
    it = iter(pipeline)
    return [[next(it).digest for _ in range(B)] for _ in range(n)]


def test_the_table_skips_from_a_restored_state_and_stays_put_on_later_resumes(tmp_path):
    plain = _recipe(tmp_path, "")
    reference = _steps(plain.build_standalone(), 7)
    first = plain.build_standalone()
    _steps(first, 2)
    state = json.loads(json.dumps(first.checkpoint()))
    recipe = _recipe(tmp_path, '[surgery]\nskip_steps = ["4..5"]\n')
    resumed = recipe.build_standalone()
    resumed.restore(state)
    assert apply_surgery(resumed, recipe.surgery(), C) == ["steps 4..5 skipped (8 batches a step)"]
    assert resumed.definition() == first.definition()  # the table is no part of the data's definition
    assert _steps(resumed, 3) == [reference[2], reference[5], reference[6]]
    later = json.loads(json.dumps(resumed.checkpoint()))
    # A later resume, on another data-parallel degree, the table still in the recipe: journaled already, nothing new.
    again = recipe.build_standalone(dp_degree=2, dp_group_id=1)
    again.restore(later)
    assert apply_surgery(again, recipe.surgery(), C) == []
    assert surgery_journal_of(again.checkpoint()) == surgery_journal_of(later)


def test_a_skip_of_steps_already_trained_or_a_document_it_does_not_have_is_refused_naming_the_table(tmp_path):
    recipe, p = _resumed(tmp_path, 3, '[surgery]\nskip_steps = ["2..4"]\n')
    with pytest.raises(StateError, match=r"r\.toml: surgery: cannot skip steps 2\.\.4: lane 0 already delivered 3"):
        apply_surgery(p, recipe.surgery(), C)
    recipe, p = _resumed(tmp_path, 3, '[surgery]\nquarantine = ["stdlib_docs.jsonl#99999999"]\n')
    with pytest.raises(ConfigError, match=r"r\.toml: surgery: quarantine stdlib_docs.jsonl#99999999: source .* has"):
        apply_surgery(p, recipe.surgery(), C)


@pytest.mark.parametrize("table, message", [
    ('skip_steps = ["12-14"]', r"surgery\.skip_steps\[0\] '12-14': give global steps as A\.\.B"),
    ('skip_steps = ["9..3"]', r"surgery\.skip_steps\[0\] '9\.\.3': a skip needs steps A\.\.B with 1 <= A <= B"),
    ('quarantine = ["a1b2c3d4e5f60718"]', r"surgery\.quarantine\[0\] 'a1b2c3d4e5f60718': name a document as SOURCE#N"),
    ('skip = ["1..2"]', r"surgery\.skip: Key 'skip' not in 'SurgerySpec'"),
])
def test_a_malformed_table_is_refused_at_load_naming_the_key(tmp_path, table, message):
    with pytest.raises(ConfigError, match=message):
        _recipe(tmp_path, f"[surgery]\n{table}\n")


def test_the_quarantine_is_journaled_once_from_where_each_lane_resumes(tmp_path):
    recipe, p = _resumed(tmp_path, 2, '[surgery]\nquarantine = ["stdlib_docs.jsonl#7", "stdlib_docs.jsonl#7"]\n')
    assert len(apply_surgery(p, recipe.surgery(), C)) == 1
    (q,) = p.surgery.quarantines
    assert q.documents == (("stdlib_docs.jsonl", 7),) and len(q.from_chunks) == C
    assert apply_surgery(p, recipe.surgery(), C) == []
    assert not _recipe(tmp_path, "").surgery()
