"""Real TorchTitan training loops (0.3.0 and 0.2.2) under torchrun on CPU, fed by Zephon.

Per version: dp=2 reference (6 steps, checkpoints every 2; Zephon's figures in
TorchTitan's TensorBoard), its resume from step 4, a dp=4 reference, elastic
resumes 4 -> 2 and 2 -> 4, FSDP 2 x TP 2 on best-fit rows (on 0.3 with llama3's
block-causal flex attention, which cuts each row at the positions Zephon restarts),
and a misconfiguration that must stop before the first step.
"""

from __future__ import annotations

from collections import Counter

import pytest
from support.ledger_runs import ledger_both_ways
from support.tensorboard_events import scalars
from torchtitan_cpu.runs import ASSETS, GLOBAL_BATCH, LOCAL_BATCH, RECIPE, SEQ_LEN, best_fit_recipe, launch, steps_of

from zephon_core.integration.batch_log import read_batch_log

pytestmark = pytest.mark.e2e
C = 4  # configs/data/tt_train.toml


@pytest.fixture(scope="module", params=["0.3", "0.2"])
def runs(request, tmp_path_factory):
    """The launches of one TorchTitan version, run lazily and shared by the tests."""
    version = request.param
    root = tmp_path_factory.mktemp(f"tt{version}")
    cache: dict[str, object] = {}

    def get(name: str):
        if name in cache:
            return cache[name]
        if name == "ref2":  # also logs Zephon's figures: its resume (without) must continue identically
            r = launch(version, 2, root / name, metrics=True)
        elif name == "ref4":
            r = launch(version, 4, root / name)
        elif name == "resume2":
            get("ref2")
            r = launch(version, 2, root / name, resume_from=root / "ref2" / "checkpoint" / "step-4")
        elif name == "elastic4to2":
            get("ref4")
            r = launch(version, 2, root / name, resume_from=root / "ref4" / "checkpoint" / "step-4")
        elif name == "elastic2to4":
            get("ref2")
            r = launch(version, 4, root / name, resume_from=root / "ref2" / "checkpoint" / "step-4")
        elif name == "tp":
            r = launch(version, 4, root / name, steps=2, extra=["--parallelism.tensor_parallel_degree", "2"],
                       loader={"recipe": str(best_fit_recipe(root))})
        else:
            raise KeyError(name)
        cache[name] = (r, root / name)
        return cache[name]

    get.version = version  # type: ignore[attr-defined]
    return get


def test_resume_continues_with_identical_losses(runs):
    (ref, ref_dir), (res, res_dir) = runs("ref2"), runs("resume2")
    assert sorted(ref.losses) == [1, 2, 3, 4, 5, 6]
    assert res.start_step == 5 and res.loaded_checkpoint and "step-4" in res.loaded_checkpoint
    assert {s: res.losses[s] for s in (5, 6)} == {s: ref.losses[s] for s in (5, 6)}
    ref_steps, res_steps = steps_of(ref_dir, C), steps_of(res_dir, C)
    assert sorted(res_steps) == [5, 6] and all(res_steps[s] == ref_steps[s] for s in (5, 6))


def test_zephon_figures_are_in_torchtitans_tensorboard_at_every_logged_step(runs):
    """Rank 0 (TorchTitan's metrics rank, data-parallel rank 0) logs its lanes' tokens, which are what its
    batch audit log says it delivered, and the run's tokens as of the last checkpoint (steps 2 and 4)."""
    ref, dump = runs("ref2")
    ev = scalars(dump / "tb")
    assert sorted(ev["loss_metrics/global_avg_loss"]) == [1, 2, 3, 4, 5, 6]
    (tokens_tag,) = [t for t in ev if t.startswith("zephon/tokens/")]
    source = tokens_tag.removeprefix("zephon/tokens/")
    logs = {int(f.stem.split("rank")[1]): list(read_batch_log(f)) for f in dump.glob("batches-rank*.log")}
    per_step = GLOBAL_BATCH // LOCAL_BATCH // len(logs)

    def delivered(rank: int, steps: int) -> int:
        return sum((Counter(b.tokens) for b in logs[rank][: steps * per_step]), Counter())[0]

    assert ev[tokens_tag] == {s: delivered(0, s) for s in range(1, 7)}
    assert ev["zephon/batches"] == {s: s * per_step for s in range(1, 7)}
    checkpointed = {3: 2, 4: 2, 5: 4, 6: 4}  # logged step -> the checkpoint before it
    assert ev[f"zephon/run/tokens/{source}"] == {s: sum(delivered(r, c) for r in logs) for s, c in checkpointed.items()}
    assert ev[f"zephon/run/share/{source}"] == dict.fromkeys(checkpointed, 1.0)
    assert all(0.0 <= v <= 1.0 for v in ev["zephon/interval/wait_fraction"].values())
    assert sorted(ev["zephon/interval/seconds"]) == [1, 2, 3, 4, 5, 6]
    assert ev["zephon/stage"] == dict.fromkeys(range(1, 7), 0.0)
    assert ref.log_text().count("zephon: stage 0 (") == 6  # the console line after each of TorchTitan's


def test_every_global_step_has_the_same_samples_on_dp2_and_dp4(runs):
    (_, d2), (_, d4) = runs("ref2"), runs("ref4")
    s2, s4 = steps_of(d2, C), steps_of(d4, C)
    assert sorted(s2) == sorted(s4) == [1, 2, 3, 4, 5, 6]
    for step in s2:
        assert len(s2[step]) == C, f"step {step} does not hold one batch of every lane"
        assert s2[step] == s4[step], f"global step {step} differs between dp=2 and dp=4"


@pytest.mark.parametrize("name,ref", [("elastic4to2", "ref4"), ("elastic2to4", "ref2")])
def test_elastic_resume_keeps_every_step(runs, name, ref):
    (res, res_dir), (_, ref_dir) = runs(name), runs(ref)
    assert res.start_step == 5, "the elastic run did not resume from step 4"
    got, want = steps_of(res_dir, C), steps_of(ref_dir, C)
    assert sorted(got) == [5, 6]
    for step in (5, 6):
        assert got[step] == want[step], f"global step {step} changed after resuming {name}"
    for step in (5, 6):  # the loss continues from the checkpoint, not from scratch
        assert abs(res.losses[step] - runs(ref)[0].losses[step]) < 0.05
    # Rank 0 says where the loader state stood and onto which degree it went, once (0.2 and 0.3 alike).
    before, after = (4, 2) if name == "elastic4to2" else (2, 4)
    said = f"zephon: loader state restored at step 4 (16 batches delivered over 4 lanes) from dp={before} to dp={after}"
    assert res.log_text().count(said) == 1, res.log_text()[-3000:]
    assert f"canonical_replicas=4, data-parallel degree {after}, {C // after} lane(s) per data-parallel rank" in (
        res.log_text())


def test_the_ledger_from_the_ranks_logs_equals_the_ledger_by_replay(runs, tmp_path):
    """Issue #35: the audit logs TorchTitan's ranks wrote say each batch's rows. The ledger of the step-4
    checkpoint built from them alone (they run on to step 6: those batches are left out and counted) is the
    ledger by replay, row for row; so is the resumed run's step-6 ledger from both runs' logs, which hold
    steps 5 and 6 twice (they agree)."""
    (_, ref), (_, res) = runs("ref2"), runs("resume2")
    shape = ["--framework", "torchtitan", "--tokenizer", str(ASSETS), "--seq-len", str(SEQ_LEN),
             "--batch-size", str(LOCAL_BATCH), "--batches-per-step", str(GLOBAL_BATCH // LOCAL_BATCH)]
    said, table = ledger_both_ways(RECIPE, ref / "checkpoint" / "step-4", shape, [f"{ref}/batches-rank*.log"], tmp_path)
    assert "8 logged batch(es) are not the state's" in said and set(table.column("step").to_pylist()) == {1, 2, 3, 4}
    logs = [f"{d}/batches-rank*.log" for d in (ref, res)]
    _, table = ledger_both_ways(RECIPE, res / "checkpoint" / "step-6", shape, logs, tmp_path)
    assert set(table.column("step").to_pylist()) == set(range(1, 7))


def test_tensor_parallel_peers_receive_identical_batches(runs):
    from torchtitan_cpu.runs import batch_log

    r, d = runs("tp")
    logs = batch_log(d)
    assert sorted(logs) == [0, 1, 2, 3]
    assert logs[0] == logs[1] and logs[2] == logs[3], "TP peers (ranks 0/1, 2/3) must get the same batches"
    assert set(logs[0]).isdisjoint(logs[2]), "the two data-parallel groups must own different lanes"
    assert sorted(r.losses) == [1, 2]
    # Best-fit rows keep documents whole and pad the rest: batches hold fewer tokens than concat's full rows.
    tokens = [sum(b.tokens.values()) for f in d.glob("batches-rank*.log") for b in read_batch_log(f)]
    assert tokens and max(tokens) <= LOCAL_BATCH * (SEQ_LEN + 1) and min(tokens) < LOCAL_BATCH * (SEQ_LEN + 1)


def test_misconfigured_canonical_replicas_fails_before_the_first_step(runs, tmp_path):
    r = launch(runs.version, 2, tmp_path / "bad", steps=2, loader={"canonical_replicas": 3}, check=False, timeout=600)
    assert r.returncode != 0
    text = r.log_text()
    # Said once, as rank 0's log line; every rank ends with status 1 and no traceback of its own.
    assert text.count("canonical_replicas=3 is not divisible by the data-parallel degree 2") == 1, text[-3000:]
    assert "[rank0]:Traceback" not in text and "IntegrationError" not in text, text[-3000:]
    assert not r.losses, "training must not start"


def test_recipe_module_trainer_hands_the_loader_the_batch_sizes(runs, tmp_path):
    """``--module zephon_torchtitan``: ZephonTrainer gives the loader the job's final batch sizes (after the CLI
    flags), so a step of 2 batches (global 4 / local 2) is refused against C=4 before the first step, without
    any Zephon option for it."""
    if runs.version != "0.3":
        pytest.skip("the recipe module is TorchTitan 0.3's")
    from torchtitan_cpu.runs import ASSETS, ROOT, harness

    dump = tmp_path / "module"
    args = ["--module", "zephon_torchtitan", "--config", "llama3_debugmodel_zephon", "--hf_assets_path", str(ASSETS),
            "--dump_folder", str(dump), "--training.local_batch_size", "2", "--training.global_batch_size", "4", "--training.steps", "2",
            "--training.mixed_precision_param", "float32"]
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'integrations' / 'torchtitan'}"}
    r = harness.run_torchtitan("0.3", 2, args, dump, env=env, cpu_defaults=False, timeout=600, check=False)
    assert r.returncode != 0
    text = r.log_text()
    assert "one optimizer step consumes 2 batches" in text and "canonical_replicas=4" in text, text[-3000:]
    assert not r.losses, "training must not start"
