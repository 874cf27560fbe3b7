"""What an adapter says about Zephon: the start-up line, a rank's lanes, where a resumed state stood; and a
start-up refusal under a launcher, said once by rank 0, every rank ending with status 1 and no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from zephon_core.integration import (
    Asked,
    Facts,
    IntegrationError,
    bundled_configs,
    lanes_line,
    load_recipe,
    load_tokenizer,
    refuse,
    restored_line,
    startup_line,
    startup_plan,
)

TRAIN = bundled_configs() / "data" / "tt_train.toml"
DEMO = bundled_configs() / "data" / "demo.toml"


def test_the_start_up_line_names_the_recipe_lanes_degree_and_aggregation():
    plan = startup_plan(str(TRAIN), Facts(dp_degree=2, world_size=2), Asked(aggregate_dir="/agg", run_id="r"),
                        framework="Test")
    assert startup_line(plan, "Test") == (
        f"zephon: Test fed by recipe {TRAIN}: canonical_replicas=4, data-parallel degree 2, "
        "2 lane(s) per data-parallel rank, checkpoints merged in /agg (run_id r)")
    alone = startup_plan(str(TRAIN), Facts(dp_degree=1), framework="Test")
    assert startup_line(alone, "Test").endswith("data-parallel degree 1, 4 lane(s) per data-parallel rank")
    assert lanes_line(3, 1, [1, 3]) == "zephon: rank 3 (data-parallel rank 1) reads lanes [1, 3]"


def test_the_restored_line_counts_the_delivered_batches_and_names_both_degrees():
    tok = load_tokenizer(str(bundled_configs() / "corpus" / "tokenizer.json"))
    pipeline = load_recipe(DEMO).build(seq_len=32, batch_size=2, tokenizer=tok, eos_id=1, dp_degree=1, dp_group_id=0,
                                       prefetch=0)
    with pipeline:
        for _, _b in zip(range(8), pipeline):
            pass
        state = pipeline.checkpoint()
    assert restored_line(state, dp_degree=2, step=None, batches_per_step=4) == (
        "zephon: loader state restored at step 2 (8 batches delivered over 8 lanes) from dp=1 to dp=2")
    assert restored_line(state, dp_degree=4, step=7, batches_per_step=None).startswith(
        "zephon: loader state restored at step 7 (")
    assert "restored (8 batches" in restored_line(state, dp_degree=1, step=None, batches_per_step=None)


def test_a_refusal_without_a_launcher_is_the_error_it_always_was():
    with pytest.raises(IntegrationError, match="^zephon: x$") as e:
        refuse(["x"])
    assert not isinstance(e.value, SystemExit)
    refuse([])  # nothing to say


@pytest.mark.parametrize("rank", [0, 1])
def test_under_a_launcher_rank_0_says_it_once_and_every_rank_exits_1_without_a_traceback(rank):
    with pytest.raises(IntegrationError) as e:  # still what callers catch
        refuse(["a", "b"], rank=rank)
    assert isinstance(e.value, SystemExit) and e.value.code == 1
    script = f"from zephon_core.integration import refuse; refuse(['canonical_replicas=3 is bad'], rank={rank})"
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == ("zephon: canonical_replicas=3 is bad\n" if rank == 0 else "")
