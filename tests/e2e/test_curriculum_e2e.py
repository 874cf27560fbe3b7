"""Staged curricula through real training loops: TorchTitan 0.3 and Megatron-LM ``pretrain()`` under torchrun.

Per framework, two launches (8 steps, DP=2, 4 lanes, a checkpoint at step 4):

* ``staged``: a recipe of two stages, "main" starting at optimizer step 3: one stage
  change inside the run;
* ``appended``: resumed from ``staged``'s step-4 checkpoint with a recipe that appends an
  "anneal" stage from step 6 (and the source it reads).

Every step's batches (the adapters' audit log) must equal what ``zephon_core`` alone
computes for the same recipe: the first run's through its stage change, the resumed
run's as the whole three-stage schedule from the start would have it.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest
from harnesses import load

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
C, ROWS_PER_STEP, STEPS = 4, 8, 8

SOURCES = "".join(
    f'[[sources]]\nname = "{n}"\npath = "{n}.npy"\nformat = "token_array"\noffsets = "{n}_offsets.npy"\n\n' for n in ("examples", "prose")
)
STAGES = """[[stages]]
name = "warmup"
weights = { examples = 1 }

[[stages]]
name = "main"
start_step = 3
weight_by = "tokens"
weights = { examples = 0.5, prose = 0.5 }
"""
ANNEAL = """
[[stages]]
name = "anneal"
start_step = 6
weight_by = "tokens"
weights = { prose = 0.3, reference = 0.7 }
"""


@pytest.fixture(scope="module")
def recipes(tmp_path_factory) -> dict[str, Path]:
    """Short documents (8-16 tokens of the bundled corpus, tokenized) in three sources, and the two recipes."""
    from torchtitan_cpu.runs import token_corpora

    root = tmp_path_factory.mktemp("curriculum")
    token_corpora(root)
    head = f"seed = 11\nchunk_size = 4\ncanonical_replicas = {C}\nglobal_batch_size = {ROWS_PER_STEP}\n\n[shuffle]\nwindow = 4\nseed = 2\n\n"
    staged, appended = root / "staged.toml", root / "appended.toml"
    staged.write_text(head + SOURCES + STAGES)
    appended.write_text(head + SOURCES + '[[sources]]\nname = "reference"\npath = "reference.npy"\nformat = "token_array"\n'
                        'offsets = "reference_offsets.npy"\n\n' + STAGES + ANNEAL)
    return {"staged": staged, "appended": appended}


def loader_steps(recipe: Path, seq_len: int, micro_batch: int) -> dict[int, tuple[dict[tuple[int, int], str], set[str]]]:
    """Step -> ({(lane, lane_index): digest}, names of the sources its rows come from), from zephon_core alone."""
    from zephon_core.recipe import load_recipe

    p = load_recipe(recipe).build(seq_len=seq_len, batch_size=micro_batch, global_batch_size=ROWS_PER_STEP, canonical_replicas=C,
                                  dp_degree=1, dp_group_id=0, prefetch=0)
    names = [s.name for s in p.work_source.sources]
    per_lane = ROWS_PER_STEP // micro_batch // C
    out: dict[int, tuple[dict[tuple[int, int], str], set[str]]] = {}
    with p:
        it = iter(p)
        for _ in range(STEPS * C * per_lane):
            b = next(it)
            batches, used = out.setdefault(b.lane_index // per_lane + 1, ({}, set()))
            batches[(b.lane, b.lane_index)] = b.digest
            used |= {names[int(s)] for s in b.segments[:, 1]}
    return out


def check_runs(staged: dict, appended: dict, want_staged: dict, want_full: dict) -> None:
    # The stage change happens inside the first run, exactly as the loader alone plans it.
    assert sorted(staged) == list(range(1, STEPS + 1))
    assert {s: staged[s] for s in staged} == {s: want_staged[s][0] for s in staged}
    assert want_staged[1][1] == {"examples"} and "prose" in want_staged[STEPS][1], "the stage change is not inside the run"
    # The resumed run is the whole schedule's, appended stage included.
    assert sorted(appended) == list(range(5, STEPS + 1))
    assert {s: appended[s] for s in appended} == {s: want_full[s][0] for s in appended}
    assert "reference" in want_full[STEPS][1] and all("reference" not in want_full[s][1] for s in range(1, 5))


# -- TorchTitan -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def torchtitan_runs(recipes, tmp_path_factory):
    from torchtitan_cpu.runs import launch

    root = tmp_path_factory.mktemp("tt-curriculum")
    a = launch("0.3", 2, root / "staged", steps=STEPS, loader={"recipe": str(recipes["staged"])})
    b = launch("0.3", 2, root / "appended", steps=STEPS, loader={"recipe": str(recipes["appended"])},
               resume_from=root / "staged" / "checkpoint" / "step-4")
    return (a, root / "staged"), (b, root / "appended")


def test_torchtitan_trains_through_a_stage_change_and_resumes_into_an_appended_stage(torchtitan_runs, recipes):
    from torchtitan_cpu.runs import LOCAL_BATCH, SEQ_LEN, steps_of

    (a, dir_a), (b, dir_b) = torchtitan_runs
    assert sorted(a.losses) == list(range(1, STEPS + 1))
    assert b.start_step == 5 and b.loaded_checkpoint and "step-4" in b.loaded_checkpoint
    assert abs(b.losses[5] - a.losses[5]) < 1e-4, "step 5 (before the appended stage) must train on the same data"
    check_runs(steps_of(dir_a, C), steps_of(dir_b, C), loader_steps(recipes["staged"], SEQ_LEN, LOCAL_BATCH),
               loader_steps(recipes["appended"], SEQ_LEN, LOCAL_BATCH))


# -- Megatron-LM --------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _megatron_importable() -> bool:
    h = load("megatron")
    try:
        return subprocess.run([h.python_exe(), "-c", "import megatron.training, megatron.core"], capture_output=True, timeout=300).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def megatron_runs(recipes, tmp_path_factory):
    if not _megatron_importable():
        pytest.skip("megatron-core >= 0.17 (megatron.training) is not importable by the harness's interpreter")
    h = load("megatron")
    root = tmp_path_factory.mktemp("mg-curriculum")
    a = h.run(root, "staged", h.Zrun("wheel", 2, recipes["staged"], train_iters=STEPS, save_interval=4))
    assert a.ok, a.log_tail()
    b = h.run(root, "appended", h.Zrun("wheel", 2, recipes["appended"], train_iters=STEPS, load=a.run_dir / "ckpt", load_step=4,
                                       loader_states_from=a.run_dir / "loader"))
    assert b.ok, b.log_tail()
    return a, b


def test_megatron_trains_through_a_stage_change_and_resumes_into_an_appended_stage(megatron_runs, recipes):
    h = load("megatron")
    a, b = megatron_runs
    assert h.GBS == ROWS_PER_STEP and h.GBS // h.MBS == C
    assert sorted(h.per_iteration(a.logged_losses)) == list(range(1, STEPS + 1))
    check_runs(a.steps(), b.steps(), loader_steps(recipes["staged"], h.SEQ, h.MBS), loader_steps(recipes["appended"], h.SEQ, h.MBS))
