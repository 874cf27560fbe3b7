"""Megatron-LM's real ``pretrain()`` under torchrun on CPU, fed by Zephon (tiny GPT).

Launches (run lazily, shared by the tests; ~6-7 minutes in all on 2 cores):

* ``tp_ref``      TP=2 x DP=2, ``python -m zephon_megatron.pretrain_gpt`` (the adapter's
                  own broadcast), Megatron ``.bin/.idx`` data, 6 steps, saves at 3 and 6,
                  evaluates a held-out recipe at 3 and 6, logs Zephon's figures to
                  Megatron's TensorBoard (``--zephon-log-metrics``);
* ``tp_resume``   the same from ``tp_ref``'s step-3 checkpoint;
* ``dp1``         TP=2 x DP=1 from ``tp_ref``'s step 3 (DP 2 -> 1), saves at 4 and 6;
* ``dp2``         TP=2 x DP=2 from ``dp1``'s step 4 (DP 1 -> 2);
* ``pp_ref``      PP=2 x DP=2, ``python -m zephon_megatron.launch`` running a stand-in for a
                  checkout's ``pretrain_gpt.py`` (Megatron's ``get_batch_on_this_tp_rank``),
                  raw text tokenized by Megatron's tokenizer, 6 steps, saves at 3;
* ``pp_resume``   the same from ``pp_ref``'s step 3;
* two launches that must refuse to start.

Production topologies (``topologies``, ~2.5 minutes more):

* ``cp_ref``      CP=2 x DP=2, wheel entry (Megatron's ``get_batch_on_this_cp_rank`` after the
                  adapter's broadcast; the shim's all-gather attention), 6 steps, saves at 3 and 6,
                  two held-out recipes evaluated at 3 and 6 (``--multiple-validation-sets
                  --full-validation``);
* ``cp_resume``   the same from ``cp_ref``'s step 3;
* ``cp_dp1``      CP=2 x DP=1 from ``cp_ref``'s step 3 (an elastic resume with CP on);
* ``vpp_ref``     PP=2 x 2 virtual stages x DP=2, launcher route, 6 steps (step 2 skipped: journaled), saves at 3;
* ``vpp_resume``  the same from ``vpp_ref``'s step 3;
* ``ramp_ref``    DP=2, ``--step-batch-size-schedule`` 8 -> 16 -> 24 samples, ``--iterations-to-skip 2``,
                  saves at 3 (and where the batch grows);
* ``ramp_dp1``    DP=1 from ``ramp_ref``'s step 3, in the middle of the ramp.
"""

from __future__ import annotations

import functools
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from harnesses import load
from support.ledger_runs import ledger_both_ways
from support.tensorboard_events import scalars

from zephon_core.integration.batch_log import read_batch_log

h = load("megatron")
STEPS = [1, 2, 3, 4, 5, 6]


@functools.lru_cache(maxsize=1)
def _megatron_available() -> bool:
    probe = "import megatron.training, megatron.core, torch, tokenizers"
    try:
        return subprocess.run([h.python_exe(), "-c", probe], capture_output=True, timeout=300).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if not _megatron_available():
        pytest.skip("megatron-core >= 0.17 (megatron.training) is not importable by the harness's interpreter")
    pytest.importorskip("megatron.core.datasets.indexed_dataset")  # make_assets writes .bin/.idx in this process
    root = tmp_path_factory.mktemp("megatron")
    assets = h.make_assets(root / "assets")
    cache: dict[str, h.RunResult] = {}

    def get(name: str) -> h.RunResult:
        if name in cache:
            return cache[name]
        Z = h.Zrun
        if name == "tp_ref":  # also logs Zephon's figures: its resume (without) must still match bit for bit
            z = Z("wheel", 4, assets.indexed_recipe, tp=2, save_interval=3, valid_recipe=assets.heldout_recipe,
                  eval_iters=1, eval_interval=3, extra=["--zephon-log-metrics", "--tensorboard-dir", "tb"])
        elif name == "tp_resume":
            ref = get("tp_ref").run_dir
            z = Z("wheel", 4, assets.indexed_recipe, tp=2, save_interval=3, valid_recipe=assets.heldout_recipe,
                  eval_iters=1, eval_interval=3, load=ref / "ckpt", load_step=3, loader_states_from=ref / "loader")
        elif name == "dp1":
            ref = get("tp_ref").run_dir
            z = Z("wheel", 2, assets.indexed_recipe, tp=2, save_interval=2, load=ref / "ckpt", load_step=3,
                  loader_states_from=ref / "loader")
        elif name == "dp2":
            src = get("dp1").run_dir
            z = Z("wheel", 4, assets.indexed_recipe, tp=2, load=src / "ckpt", load_step=4, loader_states_from=src / "loader")
        elif name == "pp_ref":
            z = Z("launch", 4, assets.text_recipe, pp=2, save_interval=3)
        elif name == "pp_resume":
            ref = get("pp_ref").run_dir
            z = Z("launch", 4, assets.text_recipe, pp=2, save_interval=3, load=ref / "ckpt", load_step=3,
                  loader_states_from=ref / "loader")
        elif name == "refuse_startup":
            # TP=2 through the checkout route without --no-create-attention-mask-in-dataloader
            # (Megatron's broadcast would hang), and 3 lanes for 4 micro-batches per step.
            z = Z("launch", 2, assets.text_recipe, tp=2, train_iters=1, no_attention_mask_flag=False,
                  extra=["--zephon-canonical-replicas", "3"])
        elif name == "refuse_missing_state":
            ref = get("tp_ref").run_dir
            only_later = root / "only-later-states"
            if not only_later.exists():
                import shutil

                shutil.copytree(ref / "loader" / "iter_0000006", only_later / "iter_0000006")
            z = Z("wheel", 2, assets.indexed_recipe, tp=2, load=ref / "ckpt", load_step=3, loader_states_from=only_later)
        else:
            raise KeyError(name)
        r = h.run(root, name, z, timeout=300 if not name.startswith("refuse") else 240)
        print(f"[megatron e2e] {name}: rc={r.returncode} {r.wall_s:.0f}s")
        if not name.startswith("refuse"):
            assert r.ok, f"{name} failed (rc={r.returncode}, timed out={r.timed_out}):\n{r.log_tail()}"
        cache[name] = r
        return r

    get.assets = assets  # type: ignore[attr-defined]
    return get


def _distinct_streams(r: h.RunResult) -> list[list[tuple[int, int, str]]]:
    logs = r.batch_log()
    assert len(logs) == 4, f"expected 4 per-rank batch logs, got ranks {sorted(logs)}"
    streams: list[list[tuple[int, int, str]]] = []
    for rows in logs.values():
        if rows not in streams:
            streams.append(rows)
    return streams


@pytest.mark.e2e
def test_tensor_parallel_peers_train_on_identical_batches(runs):
    r = runs("tp_ref")
    streams = _distinct_streams(r)
    # 4 ranks = 2 data-parallel ranks x 2 tensor-parallel peers: each peer logged what rank 0 of its
    # group sent (after checking the payload checksum), so there are exactly two distinct streams.
    assert len(streams) == 2 and all(len(s) == 6 * 2 for s in streams)
    assert {lane for s in streams for lane, _, _ in s} == {0, 1, 2, 3}
    steps = r.steps()
    assert sorted(steps) == STEPS and all(len(steps[s]) == h.C for s in STEPS)


@pytest.mark.e2e
def test_the_ledger_from_the_ranks_logs_equals_the_ledger_by_replay(runs, tmp_path):
    """Issue #35: loading ranks log full lines, TP peers what they received; the step-3 ledger from the logs
    (which run on to step 6) is the ledger by replay."""
    r, shape = runs("tp_ref"), ["--framework", "megatron", "--seq-len", str(h.SEQ), "--batch-size", str(h.MBS)]
    state = r.run_dir / "loader" / "iter_0000003" / "mp_rank_00" / "train_dataloader_dprank000.pt"
    said, _ = ledger_both_ways(runs.assets.indexed_recipe, state, shape, [f"{r.run_dir}/batches-rank*.log"], tmp_path)
    assert "12 batches, 3 steps" in said and "12 logged batch(es) are not the state's" in said, said


@pytest.mark.e2e
def test_zephon_figures_reach_megatrons_tensorboard_on_the_last_rank(runs):
    """Rank 0 (data-parallel rank 0's checkpointing Pipeline) takes the figures; rank 3, Megatron's writer,
    which holds no Pipeline (TP=2), writes them: what rank 0's audit log says it delivered, and the run's
    tokens as of the checkpoint at iteration 3."""
    r = runs("tp_ref")
    ev = scalars(r.run_dir / "tb")
    assert sorted(ev["lm loss"]) == STEPS  # Megatron's own scalars, in the same file
    (tokens_tag,) = [t for t in ev if t.startswith("zephon/tokens/")]
    logged = {int(f.stem.split("rank")[1]): list(read_batch_log(f)) for f in r.run_dir.glob("batches-rank*.log")}
    per_rank = h.GBS // h.MBS // 2  # micro-batches per step on each of the 2 data-parallel ranks

    def tokens(batches) -> int:
        return sum((Counter(b.tokens) for b in batches), Counter())[0]

    assert ev[tokens_tag] == {i: tokens(logged[0][: i * per_rank]) for i in STEPS}
    # Every micro-batch once (the tensor-parallel peers log the lines they received, without counts).
    unique = {(b.lane, b.lane_index): b for rows in logged.values() for b in rows if b.tokens}
    per_lane = h.GBS // h.MBS // h.C
    through_3 = tokens(b for (_, idx), b in unique.items() if idx < 3 * per_lane)
    assert ev["zephon/run/tokens/" + tokens_tag.removeprefix("zephon/tokens/")] == dict.fromkeys((4, 5, 6), through_3)
    assert ev["zephon/batches"] == {i: i * per_rank for i in STEPS}
    assert all(0.0 <= v <= 1.0 for v in ev["zephon/interval/wait_fraction"].values())
    assert [f"| iteration {i}" in r.text for i in STEPS] == [True] * 6  # the console line on the last rank


@pytest.mark.e2e
def test_first_and_last_pipeline_stages_read_identical_streams(runs):
    streams = _distinct_streams(runs("pp_ref"))
    assert len(streams) == 2 and all(len(s) == 12 for s in streams)


@pytest.mark.e2e
def test_raw_text_through_megatrons_tokenizer_matches_the_indexed_dataset(runs):
    # The same documents, once as Megatron .bin/.idx (EOD appended) and once as text tokenized by
    # the run's Megatron tokenizer (Zephon appends its EOD): every step holds the same batches.
    assert runs("pp_ref").steps() == runs("tp_ref").steps()


@pytest.mark.e2e
@pytest.mark.parametrize("ref,resumed", [("tp_ref", "tp_resume"), ("pp_ref", "pp_resume")])
def test_resume_gives_identical_data_and_bitwise_identical_parameters(runs, ref, resumed):
    a, b = runs(ref), runs(resumed)
    got, want = b.steps(), a.steps()
    assert sorted(got) == [4, 5, 6]
    assert {s: got[s] for s in got} == {s: want[s] for s in (4, 5, 6)}
    assert h.param_differences(a.run_dir / "ckpt", b.run_dir / "ckpt", 6) == []
    la, lb = h.per_iteration(a.logged_losses), h.per_iteration(b.logged_losses)
    for it in (4, 5, 6):
        assert abs(la[it] - lb[it]) <= 2e-6 * abs(la[it]), f"iteration {it}: {la[it]} vs {lb[it]}"
    # The resumed run found the later loader state of the run it resumed and ignored it.
    assert "ignoring loader states of later iterations [6]" in b.text


@pytest.mark.e2e
def test_every_evaluation_reads_the_same_held_out_batches(runs):
    a, b = runs("tp_ref"), runs("tp_resume")
    va, vb = a.validation, b.validation
    assert any(k.startswith("iteration 6") for k in va), va
    assert {k: v for k, v in vb.items() if k.startswith("iteration 6")} == {k: v for k, v in va.items() if k.startswith("iteration 6")}


@pytest.mark.e2e
def test_elastic_resume_dp2_to_dp1_to_dp2_keeps_every_step(runs):
    ref, dp1, dp2 = runs("tp_ref").steps(), runs("dp1").steps(), runs("dp2").steps()
    assert sorted(dp1) == [4, 5, 6] and sorted(dp2) == [5, 6]
    for s in (4, 5, 6):
        assert dp1[s] == ref[s], f"global step {s} changed after resuming DP=2 on DP=1"
    for s in (5, 6):
        assert dp2[s] == ref[s], f"global step {s} changed after resuming DP=1 on DP=2"
    # Rank 0 says which recipe and lanes fed each launch, and where a resumed loader state stood (once each).
    start_up = "canonical_replicas=4, data-parallel degree 2, 2 lane(s) per data-parallel rank"
    assert runs("tp_ref").text.count(start_up) == 1
    said = {"dp1": "at step 3 (12 batches delivered over 4 lanes) from dp=2 to dp=1",
            "dp2": "at step 4 (16 batches delivered over 4 lanes) from dp=1 to dp=2"}
    for name, where in said.items():
        assert runs(name).text.count(f"zephon: loader state restored {where}") == 1, runs(name).log_tail()
    # DP=1 wrote one state file per data-parallel rank it had (one); DP=2 resumed from it.
    assert sorted(p.name for p in (runs("dp1").run_dir / "loader" / "iter_0000004" / "mp_rank_00").iterdir()) == [
        "train_dataloader_dprank000.pt"
    ]


@pytest.mark.e2e
def test_loader_state_files_are_json_and_inspectable(runs, capsys):
    from zephon_core.cli import main as zephon_main
    from zephon_megatron.state import read_loader_file

    f = runs("tp_ref").run_dir / "loader" / "iter_0000003" / "mp_rank_00" / "train_dataloader_dprank001.pt"
    st = read_loader_file(str(f))
    assert (st.iteration, st.batches_per_step, st.delivered, st.state["canonical_replicas"]) == (3, 4, 12, h.C)
    assert zephon_main(["inspect", str(f)]) == 0
    assert "canonical_replicas: 4" in capsys.readouterr().out


@pytest.mark.e2e
def test_refuses_deadlocking_attention_mask_and_uneven_lanes_at_start_up(runs):
    r = runs("refuse_startup")
    assert r.returncode != 0 and not r.timed_out
    # Said once, by rank 0, at pretrain() entry; no rank prints a traceback of its own.
    assert r.text.count("not a multiple of canonical_replicas=3") == 1, r.log_tail()
    assert r.text.count("--no-create-attention-mask-in-dataloader (or --reset-attention-mask") == 1, r.log_tail()
    assert "ZephonMegatronError" not in r.text and "[rank0]:Traceback" not in r.text, r.log_tail()
    assert "iteration        1/" not in r.text  # stopped before the first step


@pytest.mark.e2e
def test_refuses_a_resume_without_the_loader_state_of_that_iteration(runs):
    r = runs("refuse_missing_state")
    assert r.returncode != 0 and not r.timed_out
    assert "no loader state for iteration 3" in r.text and "iterations with a loader state: [6]" in r.text
    assert "iteration        4/" not in r.text


# -- production topologies: context parallelism, virtual pipelines, batch-size schedules ------------------
SKIP = ["--iterations-to-skip", "2"]  # megatron-core's own dummy step would call next() on the list of chunk iterators
RAMP = ["--train-samples", "96", "--step-batch-size-schedule", "0:8 512:16 1536:24", "--iterations-to-skip", "2"]
RAMP_STEPS = [4, 4, 8, 8, 12, 12]  # micro-batches per step: thresholds are tokens (seq 32), 512 = 16 samples


@pytest.fixture(scope="module")
def topologies(tmp_path_factory):
    if not _megatron_available():
        pytest.skip("megatron-core >= 0.17 (megatron.training) is not importable by the harness's interpreter")
    pytest.importorskip("megatron.core.datasets.indexed_dataset")
    root = tmp_path_factory.mktemp("megatron-topologies")
    assets = h.make_assets(root / "assets")
    heldout = h.make_heldout_sets(root / "assets")
    cache: dict[str, h.RunResult] = {}

    def get(name: str) -> h.RunResult:
        if name in cache:
            return cache[name]
        Z, data = h.Zrun, assets.indexed_recipe
        sets = dict(valid_recipe=heldout, eval_iters=1, eval_interval=3, extra=["--multiple-validation-sets", "--full-validation"])
        if name == "cp_ref":
            z = Z("wheel", 4, data, cp=2, save_interval=3, **sets)
        elif name == "cp_resume":
            ref = get("cp_ref").run_dir
            z = Z("wheel", 4, data, cp=2, save_interval=3, load=ref / "ckpt", load_step=3, loader_states_from=ref / "loader", **sets)
        elif name == "cp_dp1":
            ref = get("cp_ref").run_dir
            z = Z("wheel", 2, data, cp=2, load=ref / "ckpt", load_step=3, loader_states_from=ref / "loader")
        elif name == "vpp_ref":
            z = Z("launch", 4, data, pp=2, layers=4, layers_per_virtual_stage=1, save_interval=3, extra=SKIP)
        elif name == "vpp_resume":
            ref = get("vpp_ref").run_dir
            z = Z("launch", 4, data, pp=2, layers=4, layers_per_virtual_stage=1, save_interval=3, load=ref / "ckpt", load_step=3,
                  loader_states_from=ref / "loader", extra=SKIP)
        elif name == "ramp_ref":
            z = Z("wheel", 2, data, gbs=None, train_iters=None, save_interval=3, extra=RAMP)
        elif name == "ramp_dp1":
            ref = get("ramp_ref").run_dir
            z = Z("wheel", 1, data, gbs=None, train_iters=None, load=ref / "ckpt", load_step=3, loader_states_from=ref / "loader",
                  extra=RAMP)
        else:
            raise KeyError(name)
        r = h.run(root, name, z, timeout=300)
        print(f"[megatron e2e] {name}: rc={r.returncode} {r.wall_s:.0f}s")
        assert r.ok, f"{name} failed (rc={r.returncode}, timed out={r.timed_out}):\n{r.log_tail()}"
        cache[name] = r
        return r

    get.reference = functools.lru_cache(maxsize=None)(lambda steps: h.reference_steps(assets.indexed_recipe, list(steps)))
    return get


def _distinct_streams_of(r: h.RunResult, n_ranks: int) -> list[list[tuple[int, int, str]]]:
    logs = r.batch_log()
    assert len(logs) == n_ranks, f"expected {n_ranks} per-rank batch logs, got ranks {sorted(logs)}"
    out: list[list[tuple[int, int, str]]] = []
    for rows in logs.values():
        if rows not in out:
            out.append(rows)
    return out


def _state_files(r: h.RunResult, iteration: int) -> list[str]:
    folder = r.run_dir / "loader" / f"iter_{iteration:07d}"
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.pt"))


@pytest.mark.e2e
def test_context_parallel_peers_read_the_same_full_batches_and_one_pipeline_per_dp_rank_saves(topologies):
    r = topologies("cp_ref")
    streams = _distinct_streams(r)
    # 4 ranks = 2 data-parallel ranks x 2 context-parallel peers, each peer with its own Pipeline:
    # two distinct streams, every step exactly what the recipe defines for it.
    assert len(streams) == 2 and all(len(s) == 12 for s in streams)
    assert r.steps() == topologies.reference((4,) * 6)
    assert _state_files(r, 3) == ["mp_rank_00/train_dataloader_dprank000.pt", "mp_rank_00/train_dataloader_dprank001.pt"]
    from zephon_megatron.state import read_loader_file

    st = read_loader_file(str(r.run_dir / "loader" / "iter_0000003" / "mp_rank_00" / "train_dataloader_dprank000.pt"))
    assert (st.iteration, st.delivered) == (3, 12)  # the merged state of the two coordinating Pipelines only


@pytest.mark.e2e
def test_context_parallel_training_matches_the_run_without_it(topologies, runs):
    # Same data, same initial weights: CP=2 (sequence split by Megatron, attention over the
    # all-gathered keys) computes the losses of TP=2 x DP=2 up to float rounding.
    cp, tp = h.per_iteration(topologies("cp_ref").logged_losses), h.per_iteration(runs("tp_ref").logged_losses)
    assert sorted(cp) == STEPS
    for it in STEPS:
        assert abs(cp[it] - tp[it]) <= 1e-4 * abs(tp[it]), f"iteration {it}: CP {cp[it]} vs TP {tp[it]}"


@pytest.mark.e2e
def test_context_parallel_resume_is_exact_and_each_held_out_set_has_its_own_loss(topologies):
    a, b = topologies("cp_ref"), topologies("cp_resume")
    assert b.steps() == {s: a.steps()[s] for s in (4, 5, 6)}
    assert h.param_differences(a.run_dir / "ckpt", b.run_dir / "ckpt", 6) == []
    va, vb = a.validation_sets, b.validation_sets
    assert {k[0] for k in va} == {"heldout_a", "heldout_b"} and {k[1] for k in va} >= {"iteration 3", "iteration 6"}
    assert va[("heldout_a", "iteration 3")] != va[("heldout_b", "iteration 3")]
    at6 = {k: v for k, v in va.items() if k[1] == "iteration 6"}
    assert at6 and {k: v for k, v in vb.items() if k[1] == "iteration 6"} == at6


@pytest.mark.e2e
def test_elastic_resume_with_context_parallelism_keeps_every_step(topologies):
    r = topologies("cp_dp1")
    got, want = r.steps(), topologies.reference((4,) * 6)
    assert sorted(got) == [4, 5, 6] and all(got[s] == want[s] for s in got)
    assert len(_distinct_streams_of(r, 2)) == 1  # both context-parallel peers read the same stream


@pytest.mark.e2e
def test_virtual_pipeline_chunks_are_served_from_one_stream_per_rank(topologies):
    r = topologies("vpp_ref")
    streams = _distinct_streams(r)
    # The first chunk of stage 0 and the last chunk of stage 1 read (identical streams per DP rank);
    # the other two chunks read nothing, so every rank logged each micro-batch once; the skipped
    # step 2 is journaled (zephon_megatron.surgery): the lanes leave it out, no chunk reads it.
    assert len(streams) == 2 and all(len(s) == 10 for s in streams)
    assert r.steps() == {s: b for s, b in topologies.reference((4,) * 6).items() if s != 2}
    assert sorted(r.logged_losses) == [1, 3, 4, 5, 6]
    assert _state_files(r, 3) == ["mp_rank_00_000/train_dataloader_dprank000.pt", "mp_rank_00_000/train_dataloader_dprank001.pt"]


@pytest.mark.e2e
def test_virtual_pipeline_resume_is_exact(topologies):
    a, b = topologies("vpp_ref"), topologies("vpp_resume")
    assert b.steps() == {s: a.steps()[s] for s in (4, 5, 6)}
    assert h.param_differences(a.run_dir / "ckpt", b.run_dir / "ckpt", 6) == []


@pytest.mark.e2e
def test_a_batch_size_ramp_with_a_skipped_step_keeps_every_step_across_a_dp_resize(topologies):
    ref, resized = topologies("ramp_ref"), topologies("ramp_dp1")
    want = topologies.reference(tuple(RAMP_STEPS))
    # Megatron ramped 8 -> 16 -> 24 samples; step 2 was skipped but consumed its micro-batches.
    assert ref.global_batches == {1: 8, 3: 16, 4: 16, 5: 24, 6: 24}
    assert ref.text.count("--iterations-to-skip under a batch-size ramp: the skipped iterations' micro-batches "
                          "are read and dropped") == 1
    assert ref.steps(schedule=RAMP_STEPS) == want
    # Resumed at step 3 on half the data-parallel ranks, between two sizes of the ramp.
    got = resized.steps(schedule=RAMP_STEPS)
    assert sorted(got) == [4, 5, 6] and all(got[s] == want[s] for s in got)
    assert resized.global_batches == {4: 16, 5: 24, 6: 24}


def test_per_iteration_undoes_second_iteration_average():
    assert h.per_iteration({4: 5.0, 5: 4.5, 6: 4.0}) == {4: 5.0, 5: 4.0, 6: 4.0}


def test_parse_losses_reads_a_training_log_line():
    line = (
        " [2026-01-01 00:00:00.000000] iteration        3/       6 | consumed samples:           24 |"
        " elapsed time per iteration (ms): 120.4 | learning rate: 1.000000E-03 | global batch size:     8 |"
        " lm loss: 5.512977E+00 | loss scale: 1.0 | grad norm: 1.348 |"
    )
    assert h.parse_losses(line) == {3: 5.512977}


def test_harness_path():
    assert Path(h.__file__).parent.name == "megatron_cpu"
