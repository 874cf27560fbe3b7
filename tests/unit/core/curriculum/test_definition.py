"""zephon_core.curriculum.definition: a state's definition read once, strictly, into typed values."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from zephon_core.curriculum.definition import parse_curriculum, parse_definition
from zephon_core.curriculum.mixture_base import largest_remainder
from zephon_core.errors import StateError

GOLDEN = json.loads((Path(__file__).with_name("golden_definitions.json")).read_text())
STATIC = GOLDEN["mixture:static_default"]["definition"]
STAGED = GOLDEN["mixture:staged_token_starts"]["definition"]


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_every_golden_definition_parses_and_gives_back_its_parts(case):
    raw = GOLDEN[case]["definition"]
    d = parse_definition(raw)
    ws = raw["work_source"]
    c = d.work_source
    assert c is not None and c.kind == ws["kind"] and c.seed == ws["seed"] and c.chunk_size == ws["chunk_size"]
    assert [s.definition() for s in c.sources] == ws["sources"]
    assert d.seq_len == next(op["seq_len"] for op in raw["ops"] if op["op"] == "pack")
    assert d.row_shape() == (d.batch_size, d.seq_len + 1)
    if c.static:
        assert len(c.stages) == 1 and c.stage_starts == [0] and c.stages[0].name is None
    else:  # the staged form of a staged mixture is its definition, key for key
        assert [st.definition() for st in c.stages] == ws["stages"]
        assert c.staged_form() == ws


def test_a_static_mixture_reads_as_one_document_stage():
    c = parse_curriculum(STATIC["work_source"])
    weights = [s["weight"] for s in STATIC["work_source"]["sources"]]
    (stage,) = c.stages
    assert stage.weight_by == "documents" and stage.start_chunk == 0
    assert list(stage.weights.values()) == weights
    assert list(stage.per_chunk.values()) == largest_remainder(weights, c.chunk_size)
    assert c.stage_shares() == [("documents", [w / sum(weights) for w in weights])]
    form = c.staged_form()
    assert form["static"] and form["stages"] == [stage.data()] and all("weight" not in s for s in form["sources"])
    assert stage.stage(first=True).weights == dict(zip(c.names, weights))


def test_stages_keep_the_start_they_were_given():
    c = parse_curriculum(STAGED["work_source"])
    assert [st.start for st in c.stages][1:] == [{"tokens": 900}, {"step": 40, "tokens_per_step": 34}]
    assert c.stages[2].tokens_per_step == 34 and c.stages[2].stage().start_step == 40
    assert c.sizes == [37, 11, 53]


def test_a_work_source_of_another_kind_is_none():
    assert parse_definition({"work_source": {"kind": "mine", "x": 1}, "ops": []}).work_source is None


def _broken(path, value):
    d = copy.deepcopy(STAGED)
    *keys, last = path
    target = d
    for k in keys:
        target = target[k]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return d


@pytest.mark.parametrize("path, value, field", [
    (("work_source", "seed"), "7", "definition.work_source.seed"),
    (("work_source", "chunk_size"), 0, "definition.work_source.chunk_size"),
    (("work_source", "exhausted"), "never", "definition.work_source.exhausted"),
    (("work_source", "stages"), KeyError, "definition.work_source: missing stages"),
    (("work_source", "extra"), 1, "definition.work_source: unknown extra"),
    (("work_source", "sources", 0, "name"), 3, "definition.work_source.sources[0].name"),
    (("work_source", "stages", 1, "weights", "s0"), -1, "definition.work_source.stages[1].weights.s0"),
    (("work_source", "stages", 1, "start"), {"chunk": 1, "tokens": 2}, "definition.work_source.stages[1].start"),
    (("work_source", "stages", 2, "weight_by"), "bytes", "definition.work_source.stages[2].weight_by"),
    (("work_source", "stages", 0, "per_chunk", "s0"), 1.5, "definition.work_source.stages[0].per_chunk.s0"),
    (("ops",), {}, "definition.ops"),
    (("ops", 0), {"seq_len": 3}, "definition.ops[0].op"),
])
def test_a_malformed_definition_is_one_line_naming_the_field(path, value, field):
    with pytest.raises(StateError, match=r"^state field " + field.replace("[", r"\[").replace("]", r"\]")) as e:
        parse_definition(_broken(path, value))
    assert "\n" not in str(e.value)


def test_a_static_source_needs_a_positive_weight():
    d = copy.deepcopy(STATIC)
    d["work_source"]["sources"][1]["weight"] = 0
    with pytest.raises(StateError, match=r"definition.work_source.sources\[1\].weight"):
        parse_definition(d)
