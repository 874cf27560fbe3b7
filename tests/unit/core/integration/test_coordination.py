"""The coordination both adapters resolve: lanes by precedence, and the pipeline options they make."""

from __future__ import annotations

from zephon_core.integration import (
    Coordination,
    bundled_configs,
    pipeline_options,
    resolve_canonical_replicas,
    resolve_coordination,
)
from zephon_core.recipe import load_recipe

RECIPE = bundled_configs() / "data" / "tt_train.toml"  # canonical_replicas = 4


def test_lanes_come_from_the_setting_then_the_recipe_then_the_state_then_the_dp_degree():
    recipe = load_recipe(RECIPE)
    bare = load_recipe(RECIPE, overrides={"canonical_replicas": None})
    state = {"canonical_replicas": 6}
    assert resolve_canonical_replicas(recipe, dp_degree=2, setting=8, resumed_state=state) == 8
    assert resolve_canonical_replicas(recipe, dp_degree=2, setting=0, resumed_state=state) == 4
    assert resolve_canonical_replicas(bare, dp_degree=2, resumed_state=state) == 6
    assert resolve_canonical_replicas(bare, dp_degree=2) == 2
    assert resolve_canonical_replicas(bare, dp_degree=2, resuming=True) is None
    assert resolve_canonical_replicas(recipe, dp_degree=2, resuming=True) == 4
    assert resolve_coordination(bare, dp_degree=2, resumed_state=state).canonical_replicas == 6


def test_a_lone_pipeline_gets_no_coordination_options():
    coord = Coordination(canonical_replicas=4, aggregate_dir="/shared", run_id="r1", aggregate_timeout_s=9.0)
    assert pipeline_options(coord, dp_degree=2, dp_group_id=1) == dict(dp_degree=2, dp_group_id=1, canonical_replicas=4)
    assert pipeline_options(coord, dp_degree=2, dp_group_id=1, world_size=2, global_rank=1) == dict(
        dp_degree=2, dp_group_id=1, canonical_replicas=4, world_size=2, global_rank=1, aggregate_dir="/shared",
        run_id="r1", aggregate_timeout_s=9.0,
    )
