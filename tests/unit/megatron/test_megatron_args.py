"""``--dataloader-type zephon`` survives every Megatron parse; the provider swap; the zephon -> external map.

Megatron re-parses ``sys.argv`` inside ``pretrain()`` (fault-tolerance setup,
in-process restart) without the script's extra-arguments provider; these
tests parse exactly the way those calls do.
"""

from __future__ import annotations

import argparse
import sys
from argparse import Namespace

import pytest

from zephon_megatron import args as zargs

margs = pytest.importorskip("megatron.training.arguments")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

ARGV = ["train.py", "--dataloader-type", "zephon", "--zephon-recipe", "r.toml", "--dataloader-save", "/tmp/dls",
        "--zephon-canonical-replicas", "8", "--num-layers", "2"]


@pytest.fixture()
def installed(monkeypatch):
    # Undo the wrapping after each test.
    monkeypatch.setattr(margs, "add_megatron_arguments", margs.add_megatron_arguments)
    monkeypatch.setattr(margs, "parse_args", margs.parse_args)
    zargs.install_arguments()
    return margs


def test_stock_megatron_rejects_the_choice(monkeypatch):
    monkeypatch.setattr(sys, "argv", ARGV[:3])
    parser = argparse.ArgumentParser(allow_abbrev=False)
    original = getattr(margs.add_megatron_arguments, "__wrapped__", margs.add_megatron_arguments)
    original(parser)
    with pytest.raises(SystemExit):
        parser.parse_known_args(ARGV[1:3])


def test_the_reparse_without_provider_accepts_zephon_and_its_flags(installed, monkeypatch):
    monkeypatch.setattr(sys, "argv", ARGV)
    # ft_integration.setup() and inprocess_restart: arguments.parse_args(ignore_unknown_args=True)
    ns = installed.parse_args(ignore_unknown_args=True)
    assert (ns.dataloader_type, ns.zephon_recipe, ns.dataloader_save, ns.zephon_canonical_replicas) == (
        "zephon", "r.toml", "/tmp/dls", 8)
    # the script's own strict parse, with its own provider
    seen = []

    def provider(parser):
        seen.append(True)
        parser.add_argument("--my-flag", type=int, default=3)
        return parser

    ns = installed.parse_args(provider, False)
    assert seen and ns.my_flag == 3 and ns.dataloader_type == "zephon"


def test_a_script_that_defines_dataloader_save_itself_does_not_conflict(installed, monkeypatch):
    monkeypatch.setattr(sys, "argv", ARGV)

    def provider(parser):
        parser.add_argument("--dataloader-save", type=str, default=None, help="the script's own")
        return parser

    assert installed.parse_args(provider, False).dataloader_save == "/tmp/dls"


def test_installing_twice_wraps_once(installed):
    before = (installed.add_megatron_arguments, installed.parse_args)
    zargs.install_arguments()
    assert (installed.add_megatron_arguments, installed.parse_args) == before


def test_other_dataloader_types_are_untouched(installed, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["t.py", "--dataloader-type", "cyclic"])
    ns = installed.parse_args(ignore_unknown_args=True)
    assert ns.dataloader_type == "cyclic" and not zargs.is_requested(ns) and not zargs.to_external(ns)


def test_zephon_maps_to_external_with_a_marker():
    ns = Namespace(dataloader_type="zephon")
    assert zargs.is_requested(ns) and zargs.to_external(ns)
    assert ns.dataloader_type == "external" and ns.zephon is True
    assert zargs.to_external(ns) and zargs.is_requested(ns)  # idempotent; still recognised after the map


@pytest.mark.parametrize(
    "argv,want",
    [
        (["--dataloader-type", "zephon"], True),
        (["--dataloader-type=zephon"], True),
        (["--dataloader-type", "zephon", "--dataloader-type", "single"], False),
        (["--data-path", "x"], False),
    ],
)
def test_requested_in_argv(argv, want):
    assert zargs.requested_in_argv(argv) is want


def test_settings_need_a_recipe():
    from zephon_megatron.validate import ZephonMegatronError

    with pytest.raises(ZephonMegatronError, match="--zephon-recipe"):
        zargs.Settings.from_args(Namespace(dataloader_type="zephon"))


def test_pretrain_wrapper_swaps_the_provider_only_for_zephon(monkeypatch):
    from megatron.training import global_vars

    from zephon_megatron import loader, plugin

    calls = []

    def pretrain(cfg_container, train_valid_test_dataset_provider, model_type, forward_step_func, model_provider=None):
        calls.append(train_valid_test_dataset_provider)

    def theirs(num_samples):
        raise AssertionError("not to be called")

    wrapped = plugin.wrap_pretrain(pretrain)
    assert plugin.wrap_pretrain(wrapped) is wrapped
    monkeypatch.setattr(loader, "prepare", lambda args: True)
    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", Namespace(dataloader_type="single"))
    wrapped("cfg", theirs, "enc", "fwd")
    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", Namespace(dataloader_type="zephon"))
    wrapped("cfg", theirs, "enc", "fwd", model_provider=None)
    wrapped(cfg_container="cfg", train_valid_test_dataset_provider=theirs, model_type="enc", forward_step_func="fwd")
    assert calls[0] is theirs
    assert calls[1] is calls[2] is loader.train_valid_test_datasets_provider
    assert loader.train_valid_test_datasets_provider.is_distributed


def test_prepare_maps_and_validates_from_arguments(tmp_path):
    from zephon_megatron import loader
    from zephon_megatron.validate import ZephonMegatronError

    recipe = tmp_path / "r.toml"
    recipe.write_text('canonical_replicas = 4\n[[sources]]\npath = "x.jsonl"\n')
    base = dict(dataloader_type="zephon", zephon_recipe=str(recipe), data_parallel_size=2, micro_batch_size=2,
                global_batch_size=8, tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
                eval_iters=0, create_attention_mask_in_dataloader=True, zephon_aggregate_dir=str(tmp_path), zephon_run_id="r")
    ns = Namespace(**base)
    assert loader.prepare(ns) and ns.dataloader_type == "external" and ns.zephon
    assert not loader.prepare(Namespace(dataloader_type="single"))
    with pytest.raises(ZephonMegatronError, match="not divisible by the data-parallel size 3"):
        loader.prepare(Namespace(**{**base, "data_parallel_size": 3, "global_batch_size": 12}))
    with pytest.raises(ZephonMegatronError, match="standalone"):
        recipe.write_text('[[sources]]\npath = "x.jsonl"\n[standalone]\nseq_len = 8\n')
        loader.prepare(Namespace(**base))


def test_eval_iters_0_without_eval_interval_sizes_the_datasets_as_megatron_does(installed, monkeypatch):
    """`--eval-iters 0` (what docs/megatron.md says to pass without held-out data) and no --eval-interval: megatron-core
    0.19 divides by the missing interval while sizing the datasets; the adapter gives it a value that changes nothing."""
    from megatron.training import global_vars, training

    monkeypatch.setattr(sys, "argv", [*ARGV, "--eval-iters", "0", "--train-iters", "6", "--micro-batch-size", "2", "--global-batch-size", "8"])
    ns = installed.parse_args(ignore_unknown_args=True)
    assert ns.eval_interval is None
    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", ns)
    ns.iteration, ns.consumed_train_samples, ns.consumed_valid_samples = 0, 0, 0
    ns.eval_global_batch_size = ns.global_batch_size  # what Megatron's validate_args sets
    with pytest.raises(TypeError):
        training.get_train_valid_test_num_samples()
    zargs.fill_eval_interval(ns)
    train, valid, test = training.get_train_valid_test_num_samples()
    assert (train, valid, test) == (48, 0, 0)


def test_evaluations_without_an_interval_are_refused():
    from zephon_megatron.validate import RunShape, problems

    shape = RunShape(dp=1, micro_batch_size=1, global_batch_size=4, num_microbatches=4, canonical_replicas=4, eval_iters=2,
                     eval_interval=None, valid_recipes=("held.toml",))
    assert any("needs --eval-interval N" in p for p in problems(shape))


def _zephon_args(tmp_path, **kw):
    recipe = tmp_path / "r.toml"
    recipe.write_text('canonical_replicas = 4\n[[sources]]\npath = "x.jsonl"\n')
    base = dict(dataloader_type="zephon", zephon_recipe=str(recipe), data_parallel_size=2, micro_batch_size=2,
                global_batch_size=8, tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
                eval_iters=0, create_attention_mask_in_dataloader=False, zephon_aggregate_dir=str(tmp_path),
                zephon_run_id="r", seq_length=32, train_iters=20, step_batch_size_schedule=None, rampup_batch_size=None)
    base.update(kw)
    return Namespace(**base)


def test_prepare_checks_every_step_of_megatrons_batch_size_schedule(tmp_path, capsys):
    from zephon_megatron import loader
    from zephon_megatron.validate import ZephonMegatronError

    # Thresholds are tokens (Megatron passes --seq-length 32): 256 tokens = 8 samples = after step 1.
    assert loader.prepare(_zephon_args(tmp_path, step_batch_size_schedule="0:8 256:16 1024:24"))
    with pytest.raises(ZephonMegatronError, match=r"at steps 2-3 of the --step-batch-size-schedule schedule 6 micro-batches"):
        loader.prepare(_zephon_args(tmp_path, step_batch_size_schedule="0:8 256:12 1024:24"))
    # megatron-core >= 0.18 parses --rampup-batch-size but trains at the constant --global-batch-size.
    assert loader.prepare(_zephon_args(tmp_path, rampup_batch_size=[4, 4, 100]))
    assert "ignores --rampup-batch-size" in capsys.readouterr().out


def test_several_held_out_recipes_name_megatrons_validation_sets(tmp_path):
    from zephon_megatron import loader

    for name in ("wiki", "code"):
        (tmp_path / f"{name}.toml").write_text('exhausted = "stop"\n[[sources]]\npath = "x.jsonl"\n')
    args = _zephon_args(tmp_path, zephon_valid_recipe=[str(tmp_path / "wiki.toml"), str(tmp_path / "code.toml")],
                        multiple_validation_sets=True, full_validation=True, validation_set_names=None)
    assert loader.prepare(args) and args.validation_set_names == ["wiki", "code"]


def test_the_checkpoint_hook_gets_one_chunk_iterator_of_a_virtual_pipeline(monkeypatch):
    from megatron.training import global_vars

    from zephon_megatron import plugin

    seen = []
    wrapped = plugin.wrap_save_dataloader_state(lambda it, iteration, path, **kw: seen.append((it, iteration, kw)))
    assert plugin.wrap_save_dataloader_state(wrapped) is wrapped
    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", Namespace(dataloader_type="external", zephon=True))
    wrapped([None, "chunk1"], 3, "/d", tp_group=None)
    wrapped([None, None], 3, "/d")
    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", Namespace(dataloader_type="single"))
    wrapped(["theirs"], 3, "/d")
    assert [s[0] for s in seen] == ["chunk1", None, ["theirs"]] and seen[0][2] == {"tp_group": None}


def test_a_skipped_iteration_reads_its_micro_batches_on_every_chunk_and_sends_nothing(monkeypatch):
    import megatron.core.num_microbatches_calculator as nmc
    from megatron.training import global_vars

    from zephon_megatron import plugin

    calls = []
    wrapped = plugin.wrap_dummy_train_step(lambda it: calls.append(it))
    monkeypatch.setattr(nmc, "_GLOBAL_NUM_MICROBATCHES_CALCULATOR", nmc.ConstantNumMicroBatchesCalculator(8, 2, 1, False, 1))
    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", Namespace(dataloader_type="external", zephon=True))
    chunk = iter(range(10))
    wrapped([None, chunk])
    assert next(chunk) == 4 and calls == []  # one step = 4 micro-batches, dropped
    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", Namespace(dataloader_type="single"))
    wrapped("theirs")
    assert calls == ["theirs"]


@pytest.mark.parametrize("extra,named", [
    (["--data-path", "0.7", "/d/a_text_document", "0.3", "/d/b_text_document"], "--data-path"),
    (["--train-data-path", "/d/a_text_document", "--mock-data"], "--train-data-path, --mock-data"),
])
def test_megatrons_own_data_flags_are_refused_with_the_command_that_writes_a_recipe(
        installed, monkeypatch, extra, named):
    """Megatron parses them; with zephon they would be silently ignored, so the validators name them."""
    from zephon_megatron.validate import RunShape, problems

    monkeypatch.setattr(sys, "argv", ARGV + extra)
    ns = installed.parse_args(ignore_unknown_args=True)
    ns.data_parallel_size, ns.global_batch_size, ns.micro_batch_size = 1, 8, 1
    found = [p for p in problems(RunShape.from_args(ns, canonical_replicas=8)) if "data flags" in p]
    assert len(found) == 1 and found[0].startswith(f"{named}: Megatron's data flags are not read"), found
    assert "zephon from-megatron --data-path" in found[0]
    monkeypatch.setattr(sys, "argv", ARGV)
    plain = installed.parse_args(ignore_unknown_args=True)
    plain.data_parallel_size, plain.global_batch_size, plain.micro_batch_size = 1, 8, 1
    assert RunShape.from_args(plain, canonical_replicas=8).data_flags == ()


def test_the_wheels_prebuilt_dataset_helpers_are_used_instead_of_make(monkeypatch, tmp_path):
    """megatron-core's wheel ships helpers_cpp prebuilt and no Makefile: rank 0's compile_helpers() ran
    ``make`` and exited the launch (found by the GPU check, where no CPU shim stubbed it). A source checkout
    with a Makefile still compiles."""
    import megatron.core.datasets.utils as ds_utils

    from zephon_megatron.plugin import use_prebuilt_helpers

    stock = ds_utils.compile_helpers
    monkeypatch.setattr(ds_utils, "compile_helpers", stock)
    with pytest.raises(SystemExit):
        stock()  # the wheel as installed: make finds no Makefile and Megatron exits
    assert use_prebuilt_helpers() and ds_utils.compile_helpers is not stock
    ds_utils.compile_helpers()  # a no-op now
    monkeypatch.setattr(ds_utils, "compile_helpers", stock)
    monkeypatch.setattr(ds_utils, "__file__", str(tmp_path / "utils.py"))
    (tmp_path / "Makefile").write_text("all:\n")
    assert not use_prebuilt_helpers() and ds_utils.compile_helpers is stock
