"""The one start-up plan: the same facts give the same plan; each rule refuses in one line naming the setting and
the fix; each recipe is loaded once, the lanes resolved once."""

from __future__ import annotations

from unittest import mock

import pytest

from zephon_core.integration import Asked, Facts, IntegrationError, bundled_configs, refuse, startup_plan
from zephon_core.integration import coordination as coordination_module
from zephon_core.integration.rules import Terms
from zephon_core.recipe import load_recipe

DATA = bundled_configs() / "data"
TRAIN, HELD_OUT, STAGED = str(DATA / "tt_train.toml"), str(DATA / "tt_heldout.toml"), str(DATA / "curriculum.toml")
TERMS = Terms(dp="dp degree", canonical_replicas="--lanes", aggregate_dir="--dir", run_id="--run",
              step=lambda n: f"{n} batches", step_fix=lambda C, n: f"set --gbs to a multiple of {C}")


def _plan(facts: Facts, asked: Asked | None = None, **kw):
    return startup_plan(TRAIN, facts, asked or Asked(), framework="Test", **kw)


def test_the_same_facts_give_the_same_plan():
    facts = Facts(dp_degree=2, dp_rank=1, world_size=2, global_rank=1, batches_per_step=8, rows_per_step=16)
    a, b = _plan(facts, Asked(run_id="r", aggregate_dir="/tmp/agg"), held_out=(HELD_OUT,)), \
        _plan(facts, Asked(run_id="r", aggregate_dir="/tmp/agg"), held_out=(HELD_OUT,))
    assert (a.canonical_replicas, a.coordination, a.facts, a.stage_rows) == (b.canonical_replicas, b.coordination,
                                                                             b.facts, b.stage_rows)
    assert a.canonical_replicas == 4 and a.problems(TERMS) == []
    assert [(h.path, h.canonical_replicas) for h in a.held_out] == [(h.path, h.canonical_replicas) for h in b.held_out]
    assert a.options()["dp_group_id"] == 1 and a.options()["run_id"] == "r"


def test_each_recipe_is_loaded_once_and_the_lanes_resolved_once():
    with mock.patch.object(coordination_module, "load_recipe", wraps=coordination_module.load_recipe) as load, \
            mock.patch("zephon_core.integration.plan.resolve_canonical_replicas",
                       wraps=coordination_module.resolve_canonical_replicas) as lanes:
        _plan(Facts(dp_degree=2), held_out=(HELD_OUT, HELD_OUT))
    assert load.call_count == 3
    assert lanes.call_count == 3  # the run's, then each held-out set's own


def test_resuming_leaves_the_lanes_to_the_state():
    plan = startup_plan(TRAIN, Facts(dp_degree=2), Asked(), framework="Test", resuming=True)
    assert plan.canonical_replicas == 4  # the recipe's wins over a state
    bare = plan.resumed({"canonical_replicas": 6})
    assert bare.canonical_replicas == 4 and bare.coordination.canonical_replicas == 4
    asked = startup_plan(TRAIN, Facts(dp_degree=2), Asked(canonical_replicas=8), framework="Test", resuming=True)
    assert asked.resumed(None).canonical_replicas == 8


@pytest.mark.parametrize(
    ("facts", "asked", "names"),
    [
        (Facts(dp_degree=3), Asked(), ("--lanes", "dp degree 3")),
        (Facts(dp_degree=2, batches_per_step=6), Asked(), ("6 batches", "set --gbs to a multiple of 4")),
        (Facts(dp_degree=2, world_size=2), Asked(run_id="r"), ("set --dir",)),
    ],
)
def test_each_topology_rule_refuses_in_one_line_naming_the_setting_and_the_fix(facts, asked, names):
    problems = _plan(facts, asked).problems(TERMS)
    assert len(problems) == 1 and "\n" not in problems[0]
    assert all(name in problems[0] for name in names), problems
    with pytest.raises(IntegrationError, match=r"^zephon: "):
        refuse(problems)


def test_stages_at_optimizer_steps_are_refused_under_a_batch_size_schedule():
    # curriculum.toml (stage 2 starts at step 60) without its [standalone] section, as a framework reads it
    bare = load_recipe(STAGED, overrides={"standalone": None})
    with mock.patch("zephon_core.integration.plan.load_training_recipe", return_value=bare):
        steady = startup_plan(STAGED, Facts(dp_degree=1, rows_per_step=32), framework="Test")
        ramp = startup_plan(STAGED, Facts(dp_degree=1, rows_per_step=32, step_varies=True), framework="Test")
    assert steady.stepped_stages == (2,) and steady.stage_rows == 32 and steady.problems(None) == []
    (problem,) = ramp.problems(None)
    assert ramp.stage_rows is None
    assert f"stages[{ramp.stepped_stages[0]}].start_step" in problem and "start the stage with start_tokens" in problem


def test_a_validation_plan_never_coordinates():
    plan = _plan(Facts(dp_degree=2, world_size=1))
    assert "aggregate_dir" not in plan.options() and plan.problems(TERMS) == []


def test_the_step_size_rule_holds_at_every_run_of_a_schedule_and_names_the_first_that_breaks_it():
    at = Terms(dp="dp degree", canonical_replicas="--lanes", aggregate_dir="--dir", run_id="--run",
               step=lambda n: f"{n} batches", step_fix=lambda C, n: f"set --gbs to a multiple of {C}",
               at=lambda first, last: Terms(dp="dp degree", canonical_replicas="--lanes", aggregate_dir="--dir",
                                            run_id="--run", step=lambda n: f"{n} batches at steps {first}-{last}",
                                            step_fix=lambda C, n: "fix it"))
    good = _plan(Facts(dp_degree=2, batches_per_step=4, step_runs=((1, 2, 4), (3, 9, 8))))
    assert good.problems(at) == [] and good.step_run() == (1, 2, 4)
    bad = _plan(Facts(dp_degree=2, batches_per_step=4, step_runs=((1, 2, 4), (3, 4, 6), (5, 9, 10))))
    (problem,) = bad.problems(at)
    assert bad.step_run() == (3, 4, 6) and "6 batches at steps 3-4" in problem and "fix it" in problem
    assert bad.problems(TERMS) == ["one optimizer step consumes 6 batches, which is not a multiple of "
                                   "canonical_replicas=4; set --gbs to a multiple of 4 so every step holds the same "
                                   "samples after a resize"]  # terms without ``at`` word it without the steps


def test_a_replica_groups_run_id_is_the_resolved_one_with_its_suffix_once():
    facts = Facts(dp_degree=2, world_size=2)
    assert _plan(facts, Asked(run_id="r", run_id_suffix="-replica1")).coordination.run_id == "r-replica1"
    assert _plan(facts, Asked(run_id="r-replica1", run_id_suffix="-replica1")).coordination.run_id == "r-replica1"
    recipes = _plan(facts, Asked(run_id_suffix="-replica0")).recipe.spec.aggregate.run_id
    assert _plan(facts, Asked(run_id_suffix="-replica0")).coordination.run_id == (
        f"{recipes}-replica0" if recipes else None)
