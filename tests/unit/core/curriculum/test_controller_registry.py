"""Mixing controllers a recipe names (curriculum/controller_registry.py): registered names, entry points and
``module:Class`` paths, each refused in one line naming ``mixing.controller`` when it is not a controller; a user's
controller steers a ``MixingLoader``; a state names its controller and never imports one."""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from importlib import metadata

import pytest

from zephon_core import MemorySource, Pipeline, StaticMixture
from zephon_core.curriculum import controller_registry
from zephon_core.curriculum.controller_registry import (
    COMMON_KEYS,
    GROUP,
    controller_from,
    register_controller,
    registered_controllers,
    unregister_controller,
)
from zephon_core.curriculum.controllers import OdmController
from zephon_core.errors import ConfigError
from zephon_core.pipeline.mixing import LocalFigures, Mixing, MixingLoader
from zephon_core.recipe import load_recipe
from zephon_core.recipe.schema import MixingSpec

FAVOUR = '''
class Favour:
    """Steers towards one source: weight ``gain`` for it, 1 for the others."""

    name = "favour"
    keys = ("source", "gain")

    def __init__(self, source, gain=2.0):
        self.source, self.gain, self.asked = source, float(gain), 0

    def params(self):
        return {"source": self.source, "gain": self.gain}

    def propose(self, inputs):
        self.asked += 1
        return [self.gain if n == self.source else 1.0 for n in inputs.names]

    def state(self):
        return {"asked": self.asked}

    def load_state(self, state):
        self.asked = int(state["asked"])


def not_a_class():
    pass


class Lacking:
    name = "lacking"

    def params(self):
        return {}
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module of the user's, ``zephon_test_favour``, importable from ``tmp_path``; forgotten after the test."""
    (tmp_path / "zephon_test_favour.py").write_text(FAVOUR)
    (tmp_path / "zephon_test_broken.py").write_text("def oops(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "zephon_test_favour"
    for name in ("zephon_test_favour", "zephon_test_broken", "favour"):
        sys.modules.pop(name, None)


def recipe_with(tmp_path, mixing: str):
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    path = tmp_path / "r.toml"
    path.write_text('[[sources]]\npath = "a.jsonl"\nname = "a"\n\n[mixing]\ninterval_steps = 2\n' + mixing)
    return load_recipe(path)


def loader(mixing: Mixing) -> MixingLoader:
    srcs = [MemorySource([[i * 100 + d] * (1 + d % 7) for d in range(40)], name=f"s{i}") for i in range(3)]
    pipe = Pipeline(StaticMixture(srcs, [1, 1, 1], seed=2, chunk_size=8)).pack(8).batch(2)
    return MixingLoader(pipe.options(canonical_replicas=2, dp_degree=1, dp_group_id=0), mixing)


def steer(run: MixingLoader, first: int, last: int) -> list:
    decisions = []
    for step in range(first, last + 1):
        next(run)
        run.record_loss([1.0, 2.0, 3.0], [10, 10, 10])
        if run.due(step):
            decisions.append(run.decide(step, LocalFigures.reduced([run.local_figures()])))
    return decisions


def test_the_builtins_are_registered_as_a_users_would_be_and_the_schema_holds_the_common_keys():
    assert registered_controllers()[:3] == ["identity", "schedule", "odm"]
    assert {f.name for f in fields(MixingSpec)} - {"controller_keys"} == set(COMMON_KEYS)
    odm = controller_from({"controller": "odm", "alpha": 0.5, "interval_steps": 3})
    assert isinstance(odm, OdmController) and odm.alpha == 0.5


def test_a_users_controller_named_by_path_in_a_recipe_builds_and_steers(tmp_path, user_module):
    recipe = recipe_with(tmp_path, f'controller = "{user_module}:Favour"\nsource = "s1"\ngain = 3\nmax_change = 1\n')
    mixing = recipe.mixing()
    assert type(mixing.controller).__module__ == user_module and mixing.controller.params() == {"source": "s1",
                                                                                                 "gain": 3.0}
    run = loader(mixing)
    decisions = [d for d in steer(run, 1, 4) if d is not None]
    assert decisions[0].controller == "favour" and decisions[0].weights == {"s0": 2000, "s1": 6000, "s2": 2000}
    state = json.loads(json.dumps(run.checkpoint()))
    run.close()
    assert state["steering"]["controller"] == "favour" and state["steering"]["state"] == {"asked": 2}
    resumed = loader(recipe.mixing())
    resumed.restore(state)
    assert resumed.mixing.controller.asked == 2 and resumed.shares() == run.shares()
    resumed.close()


def test_a_registered_controller_and_an_entry_point_are_named_by_name(tmp_path, user_module, monkeypatch):
    favour = __import__(user_module).Favour
    register_controller("favour", lambda args: favour(**args.keys), keys=("source", "gain"))
    try:
        assert controller_from({"controller": "favour", "source": "a"}).params() == {"source": "a", "gain": 2.0}
        with pytest.raises(ConfigError, match=r"^mixing.alpha is not a key of controller 'favour' \(its keys: "
                                              r"source, gain; alpha is 'odm''s\); remove it$"):
            controller_from({"controller": "favour", "source": "a", "alpha": 0.5})
        with pytest.raises(ValueError, match="registered already"):
            register_controller("favour", lambda args: favour(**args.keys))
    finally:
        unregister_controller("favour")
    with pytest.raises(ValueError, match="'min_share' is a common mixing key"):
        register_controller("greedy", favour, keys=("min_share",))
    ep = metadata.EntryPoint(name="favour", value=f"{user_module}:Favour", group=GROUP)
    monkeypatch.setattr(controller_registry.metadata, "entry_points", lambda group: [ep] if group == GROUP else [])
    assert "favour" in registered_controllers()
    assert recipe_with(tmp_path, 'controller = "favour"\nsource = "a"\n').mixing().controller.name == "favour"


@pytest.mark.parametrize("value,needle", [
    ("dorem", r"mixing.controller must be one of identity, schedule, odm\S* or a 'module:Class' path"),
    ("zephon_test_absent:X", r"mixing.controller: cannot import 'zephon_test_absent' .*ModuleNotFoundError"),
    ("zephon_test_broken:X", r"mixing.controller: cannot import 'zephon_test_broken' .*SyntaxError"),
    ("zephon_test_favour:Nope", r"mixing.controller: module 'zephon_test_favour' has no 'Nope'"),
    ("zephon_test_favour:not_a_class", r"mixing.controller: 'zephon_test_favour:not_a_class' is not a mixing "
                                       r"controller \(a function, not a class\)"),
    ("zephon_test_favour:Lacking", r"mixing.controller: 'zephon_test_favour:Lacking' is not a mixing controller "
                                   r"\(it lacks propose, state, load_state\)"),
    ("zephon_core.curriculum.controllers:IdentityController", None),
])
def test_a_name_that_is_no_controller_is_refused_in_one_line_naming_the_key(tmp_path, user_module, value, needle):
    if needle is None:  # a built-in by its path is the built-in
        assert recipe_with(tmp_path, f'controller = "{value}"\n').mixing().controller.name == "identity"
        return
    with pytest.raises(ConfigError, match=needle) as e:
        recipe_with(tmp_path, f'controller = "{value}"\n')
    assert str(e.value).startswith(f"{tmp_path / 'r.toml'}: mixing.controller") and "\n" not in str(e.value)


def test_keys_are_checked_by_the_chosen_controller(tmp_path, user_module):
    for body, needle in [(f'controller = "{user_module}:Favour"\nalpha = 0.5\n',
                          "mixing.alpha is not a key of controller 'favour' (its keys: source, gain; alpha is "
                          "'odm''s); remove it"),
                         ('controller = "odm"\nalpha = "high"\n', "mixing.alpha: must be a finite number, got 'high'"),
                         ('controller = "identity"\nweights = 3\n', "mixing.weights: must be a table of source"),
                         ('controller_keys = { alpha = 1 }\n', "mixing.controller_keys is not a mixing key"),
                         (f'controller = "{user_module}:Favour"\n', "Favour refused its keys {}")]:
        with pytest.raises(ConfigError) as e:
            recipe_with(tmp_path, body)
        assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_state_names_its_controller_and_restoring_it_imports_nothing(tmp_path, user_module):
    """Only a recipe resolves a controller. A state steered by 'favour' restored into a run whose recipe names
    odm is refused by name, though a module called favour, which fails when imported, is on the path."""
    run = loader(recipe_with(tmp_path, f'controller = "{user_module}:Favour"\nsource = "s2"\n').mixing())
    steer(run, 1, 2)
    state = json.loads(json.dumps(run.checkpoint()))
    run.close()
    marker = tmp_path / "favour.imported"
    (tmp_path / "favour.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise RuntimeError('imported')\n")
    sys.modules.pop(user_module)
    other = loader(Mixing(OdmController(), interval_steps=2))
    with pytest.raises(ConfigError, match=r"steered by controller 'favour', this run's \[mixing\] names 'odm'; set "
                                          r"controller to the 'module:Class' path of the controller named 'favour'"):
        other.restore(state)
    other.close()
    assert not marker.exists() and user_module not in sys.modules
    same = loader(Mixing(controller_from({"controller": f"{user_module}:Favour", "source": "s2"}), interval_steps=2))
    same.restore(state)  # the recipe's path imported it again: the names agree
    assert same.mixing.controller.asked == 1
    same.close()
