"""zephon_megatron's start-up validators: each refusal, and the message that says what to change."""

from __future__ import annotations

from argparse import Namespace

import pytest

from zephon_megatron.loader import plan_of
from zephon_megatron.schedule import Steps
from zephon_megatron.validate import RunShape, ZephonMegatronError, check, problems, shape_of, terms


def shape(**kw) -> RunShape:
    base = dict(dp=2, micro_batch_size=2, global_batch_size=8, num_microbatches=2, canonical_replicas=4,
                create_attention_mask=False)
    base.update(kw)
    return RunShape(**base)


def refusals(tmp_path, canonical_replicas: int | None = 4, runs: tuple[tuple[int, int, int], ...] = (),
             **kw) -> list[str]:
    """What start-up refuses of a Megatron run (the plan's rules in Megatron's terms, then Megatron's own), from its
    arguments and a real recipe; ``runs``: the global batch of a schedule's runs of steps."""
    from zephon_megatron.args import Settings

    recipe = tmp_path / "r.toml"
    lanes = f"canonical_replicas = {canonical_replicas}\n" if canonical_replicas else ""
    recipe.write_text(lanes + '[[sources]]\npath = "x.jsonl"\n')
    base = dict(dataloader_type="zephon", zephon_recipe=str(recipe), data_parallel_size=2, micro_batch_size=2,
                global_batch_size=8, eval_iters=0, create_attention_mask_in_dataloader=False,
                zephon_aggregate_dir="/shared/agg", zephon_run_id="run")
    args = Namespace(**{**base, **kw})
    steps = Steps(bool(runs), runs[0][2] if runs else args.global_batch_size, runs)
    plan = plan_of(args, Settings.from_args(args), steps)
    s = shape_of(args, plan, steps)
    return plan.problems(terms(s)) + problems(s)


def test_a_good_run_has_no_problems():
    assert problems(shape()) == []
    check(shape())


def test_canonical_replicas_must_be_divisible_by_dp(tmp_path):
    (msg,) = refusals(tmp_path, data_parallel_size=3, global_batch_size=12)
    assert "canonical_replicas=4 is not divisible by the data-parallel size 3" in msg
    assert "[1, 2, 4]" in msg and "--zephon-canonical-replicas" in msg


def test_batches_per_step_must_be_a_multiple_of_canonical_replicas(tmp_path):
    (msg,) = refusals(tmp_path, global_batch_size=4)
    assert "1 x 2 = 2 micro-batches" in msg and "not a multiple of canonical_replicas=4" in msg
    assert "--global-batch-size to a multiple of 8" in msg


def test_unknown_canonical_replicas_is_checked_later(tmp_path):
    assert refusals(tmp_path, canonical_replicas=None, data_parallel_size=3, global_batch_size=12, load="/ckpt") == []


def test_aggregation_is_needed_beyond_one_dp_rank(tmp_path):
    (msg,) = refusals(tmp_path, zephon_aggregate_dir=None, zephon_run_id=None)
    assert "--zephon-aggregate-dir and --zephon-run-id" in msg
    assert refusals(tmp_path, data_parallel_size=1, zephon_aggregate_dir=None, zephon_run_id=None) == []


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(hybrid_cp=True), "--hybrid-context-parallel"),
        (dict(eval_iters=10), "--zephon-valid-recipe"),
        (dict(full_validation=True), "no held-out data is given; pass --zephon-valid-recipe"),
        (dict(eval_iters=1, valid_recipes=("a.toml", "b.toml")), "add both flags"),
        (dict(eval_iters=1, valid_recipes=("a.toml",), multiple_validation_sets=True), "add --full-validation"),
        (dict(full_validation=True, valid_recipes=("a.toml",), endless_valid_recipes=("a.toml",)), 'exhausted = "stop"'),
        (dict(sft=True), "--sft"),
        (dict(reset_attention_mask=True, create_attention_mask=False), "--reset-attention-mask needs"),
        (dict(inter_document_masking=True, megatron_broadcast=False), "packed-sequence parameters"),
        (dict(save="/ckpt", dataloader_save=None), "pass --dataloader-save"),
    ],
)
def test_each_unsupported_setting_is_refused_with_its_fix(kw, needle):
    found = problems(shape(**kw))
    assert len(found) == 1 and needle in found[0], found


def test_eval_with_held_out_recipes_is_fine():
    assert problems(shape(eval_iters=10, valid_recipes=("heldout.toml",))) == []
    assert problems(shape(full_validation=True, valid_recipes=("heldout.toml",))) == []
    assert problems(shape(full_validation=True, multiple_validation_sets=True, valid_recipes=("a.toml", "b.toml"))) == []


def test_production_topologies_are_accepted():
    # TP8 x CP2 x PP8 with virtual stages: nothing about them changes what a step holds.
    assert problems(shape(tp=8, cp=2, pp=8, virtual_pp=4, create_attention_mask=False)) == []


def test_a_batch_ramp_is_checked_step_by_step_and_the_first_bad_step_is_named(tmp_path):
    ramp = ((1, 2, 8), (3, 4, 16), (5, 100, 24))
    flag = dict(step_batch_size_schedule="0:8")
    assert refusals(tmp_path, runs=ramp, **flag) == []
    (msg,) = refusals(tmp_path, runs=((1, 2, 8), (3, 3, 12), (4, 100, 16)), **flag)
    assert "at step 3 of the --step-batch-size-schedule schedule 6 micro-batches (global batch 12" in msg
    assert "not a multiple of canonical_replicas=4" in msg and "multiple of 8 (e.g. 16 at step 3)" in msg
    (msg,) = refusals(tmp_path, runs=((1, 5, 8), (6, 9, 9)), rampup_batch_size=[8, 1, 40])
    assert "global batch of 9 at steps 6-9, not a multiple of --micro-batch-size 2" in msg


def test_tensor_parallel_attention_mask_deadlock_is_refused_on_the_megatron_broadcast_route():
    (msg,) = problems(shape(tp=2, create_attention_mask=True))
    assert "hang" in msg and "--no-create-attention-mask-in-dataloader" in msg
    # Fine when the mask is off, when a mask is actually made, with TP=1, or with the adapter's own broadcast.
    assert problems(shape(tp=2, create_attention_mask=False)) == []
    assert problems(shape(tp=2, create_attention_mask=True, reset_attention_mask=True)) == []
    assert problems(shape(tp=1, create_attention_mask=True)) == []
    assert problems(shape(tp=2, create_attention_mask=True, megatron_broadcast=False)) == []


def test_check_lists_every_problem_at_once():
    with pytest.raises(ZephonMegatronError) as e:
        check(shape(batch_steps=((1, 2, 8), (3, 9, 9)), hybrid_cp=True))
    text = str(e.value)
    assert text.startswith("zephon: this run cannot start:") and text.count("\n  - ") == 2
    assert isinstance(e.value, ValueError)


def test_shape_from_megatron_arguments():
    args = Namespace(data_parallel_size=2, micro_batch_size=2, global_batch_size=16, tensor_model_parallel_size=2,
                     pipeline_model_parallel_size=1, context_parallel_size=1, virtual_pipeline_model_parallel_size=None,
                     rampup_batch_size=None, eval_iters=0, create_attention_mask_in_dataloader=False,
                     reset_attention_mask=False, dataloader_inter_document_masking=False, sft=False, save=None,
                     dataloader_save=None)
    s = RunShape.from_args(args, canonical_replicas=8)
    assert (s.num_microbatches, s.batches_per_step, s.tp) == (4, 8, 2)
    assert problems(s) == []
