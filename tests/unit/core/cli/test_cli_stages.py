"""The ``zephon`` commands on staged recipes (configs/data/curriculum*.toml), run as a user would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import zephon as cli

ROOT = Path(__file__).resolve().parents[4]
MAIN = ROOT / "configs" / "data" / "curriculum_main.toml"  # warm-up and main
FULL = ROOT / "configs" / "data" / "curriculum.toml"  # the same with an anneal stage appended at step 60


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    """Merged states of curriculum_main.toml on 2 groups after 20 and after 70 global steps of 8 batches."""
    from zephon_core.recipe import load_recipe
    from zephon_core.verify.simulate import Phase, run_phase

    recipe = load_recipe(MAIN)
    out = tmp_path_factory.mktemp("stage-states")
    paths = {}
    state = None
    for name, steps in (("step20", 20), ("step70", 50)):
        _, state = run_phase(lambda G, g: recipe.build_standalone(dp_degree=G, dp_group_id=g, prefetch=0), Phase(2, steps), 8, state)
        paths[name] = out / f"{name}.json"
        paths[name].write_text(json.dumps(state))
    return paths


def test_explain_prints_the_schedule():
    r = cli("explain", str(FULL))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "StagedMixture(seed=20261201, chunk_size=16, exhausted='repeat', shuffle=True): 3 stage(s) over 3 source(s)" in out
    assert "stage 1 'main': chunks 9..47, weight_by=tokens, start_tokens=20000 -> chunk 9" in out
    assert "stage 2 'anneal': chunks 48..(on), weight_by=tokens, start_step=60 x 2064 tokens -> chunk 48" in out
    assert "not read: reference (stays at 1.22 epochs)" in out
    assert "tokens estimated at" in out and "per stored byte" in out


def test_diff_says_whether_a_checkpoint_resumes_into_a_recipe(states):
    ok = cli("diff", str(states["step20"]), str(FULL))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith("accepted: work_source.stages[2] ('anneal') changes the data from global chunk 48")
    assert "work_source.stages[2] ('anneal'): appended, from global chunk 48" in ok.stdout
    late = cli("diff", str(states["step70"]), str(FULL))
    assert late.returncode == 1
    assert late.stdout.startswith("refused: the checkpoint was taken with different data") and "must start at global chunk" in late.stdout
    same = cli("diff", str(states["step20"]), str(MAIN))
    assert same.returncode == 0 and same.stdout.startswith("accepted: same data definition")
    wrong_order = cli("diff", str(FULL), str(states["step20"]))
    assert wrong_order.returncode == 1 and "give the checkpoint first" in wrong_order.stderr


def test_inspect_lists_the_stages_of_a_state(states):
    r = cli("inspect", str(states["step20"]))
    assert r.returncode == 0, r.stderr
    assert "stage 1 'main': from global chunk 9 ({'tokens': 20000}), weight_by=tokens" in r.stdout


def test_verify_elastic_across_a_stage_change_a_dp_change_and_an_appended_stage():
    r = cli("verify-elastic", str(MAIN), "--resume-recipe", str(FULL), "--canonical-replicas", "8", "--from", "8", "--to", "2",
            "--checkpoint-step", "40", "--steps", "70")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ok: 70 global steps identical: dp_degree 8 throughout vs 8 -> 2 at step 40, resumed with")
    assert lines[1].startswith("curriculum audit of global chunks 0..55: no document repeated within a source epoch, none skipped")
    late = cli("verify-elastic", str(MAIN), "--resume-recipe", str(FULL), "--canonical-replicas", "8", "--from", "8", "--to", "2",
               "--checkpoint-step", "66", "--steps", "70")
    assert late.returncode == 1 and "must start at global chunk" in late.stderr


def test_trace_names_the_stage_and_audits_the_curriculum_so_far():
    r = cli("trace", str(FULL), "--step", "65", "--canonical-replicas", "8")
    assert r.returncode == 0, r.stderr
    assert "(then at global chunk" in r.stdout and ", stage 'anneal')" in r.stdout
    assert "no document repeated within a source epoch, none skipped" in r.stdout
