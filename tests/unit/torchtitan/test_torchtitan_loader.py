"""zephon_torchtitan at loader level: TorchTitan 0.3 classes, built directly (no torchrun)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from torchtitan.components.tokenizer import HuggingFaceTokenizer  # noqa: E402
from tt022 import run_022  # noqa: E402

import zephon_torchtitan as zt  # noqa: E402
from zephon_core import StateError  # noqa: E402
from zephon_torchtitan.core import IGNORE_INDEX, STATE_KEY, decode_state, encode_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "configs" / "data" / "tt_train.toml"
HELDOUT = ROOT / "configs" / "data" / "tt_heldout.toml"


@pytest.fixture(scope="module")
def tok():
    return HuggingFaceTokenizer(tokenizer_path=str(ROOT / "configs" / "corpus"))


def build(tok, recipe=RECIPE, dp=2, rank=0, **cfg):
    cfg.setdefault("global_batch_size", 8)
    return zt.ZephonDataLoader.Config(recipe=str(recipe), **cfg).build(dp_world_size=dp, dp_rank=rank, tokenizer=tok, seq_len=64, local_batch_size=2)


def test_batches_are_in_torchtitan_format(tok):
    x, y = next(iter(build(tok)))
    assert set(x) == {"input", "positions"}
    assert x["input"].shape == x["positions"].shape == y.shape == (2, 64)
    assert x["input"].dtype == y.dtype == torch.int64
    assert torch.equal(x["input"][:, 1:], y[:, :-1])  # labels are inputs shifted by one


def test_padding_labels_use_the_ignore_index(tok, tmp_path):
    recipe = tmp_path / "pad.toml"
    recipe.write_text(RECIPE.read_text().replace("canonical_replicas = 4", 'canonical_replicas = 4\npack_mode = "pad"').replace('"../corpus/', f'"{ROOT}/configs/corpus/'))
    it = iter(build(tok, recipe=recipe))
    labels = torch.cat([next(it)[1] for _ in range(20)])
    assert (labels == IGNORE_INDEX).any() and (labels != IGNORE_INDEX).any()


def test_state_round_trip_continues_exactly(tok):
    a = build(tok)
    it = iter(a)
    for _ in range(3):
        next(it)
    sd = a.state_dict()
    assert set(sd) == {STATE_KEY} and sd[STATE_KEY].dtype == torch.uint8
    b = build(tok)
    b.load_state_dict(sd)
    for _ in range(3):
        (xa, ya), (xb, yb) = next(it), next(iter(b))
        assert torch.equal(xa["input"], xb["input"]) and torch.equal(ya, yb)


def test_load_of_an_empty_state_is_a_no_op(tok):
    a, b = build(tok), build(tok)
    b.load_state_dict({})
    assert torch.equal(next(iter(a))[0]["input"], next(iter(b))[0]["input"])


def test_state_from_another_recipe_is_refused_naming_the_field(tok, tmp_path):
    sd = build(tok).state_dict()
    other = tmp_path / "other.toml"
    other.write_text(RECIPE.read_text().replace("seed = 20261129", "seed = 1").replace('"../corpus/', f'"{ROOT}/configs/corpus/'))
    with pytest.raises(StateError, match=r"work_source.seed: 20261129 vs 1"):
        build(tok, recipe=other).load_state_dict(sd)


def test_state_from_another_tokenizer_is_refused(tok, tmp_path):
    sd = build(tok).state_dict()
    folder = tmp_path / "tok"
    folder.mkdir()
    spec = json.loads((ROOT / "configs" / "corpus" / "tokenizer.json").read_text())
    spec["model"]["vocab"]["zzzz_extra"] = len(spec["model"]["vocab"])
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "tokenizer_config.json").write_text((ROOT / "configs" / "corpus" / "tokenizer_config.json").read_text())
    with pytest.raises(StateError, match=r"ops\[0\].tokenizer"):
        build(HuggingFaceTokenizer(tokenizer_path=str(folder))).load_state_dict(sd)


def test_state_slot_never_unpickles():
    assert decode_state(encode_state({"a": 1}, 64)) == {"a": 1}
    with pytest.raises(ValueError, match="corrupt"):
        decode_state(torch.zeros(64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="raise it"):
        encode_state({"x": "y" * 100}, 64)


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"dp": 3}, "canonical_replicas=4 is not divisible by the data-parallel degree 3"),
        ({"global_batch_size": 6}, "consumes 3 batches"),
        ({"canonical_replicas": 8, "global_batch_size": 4}, "consumes 2 batches"),
    ],
)
def test_start_up_validators(tok, kw, message):
    with pytest.raises(ValueError, match=message):
        build(tok, **kw)


def test_multi_rank_run_needs_an_aggregate_folder(tok, monkeypatch):
    import zephon_torchtitan.core as core

    monkeypatch.setattr(core, "coordination_identity", lambda: (4, 1))
    with pytest.raises(ValueError, match="set aggregate_dir and run_id"):
        build(tok)


def test_training_recipe_with_a_standalone_section_is_refused(tok):
    with pytest.raises(ValueError, match="standalone"):
        build(tok, recipe=ROOT / "configs" / "data" / "demo.toml")


def test_validation_loader_makes_one_finite_pass(tok):
    loader = zt.ZephonDataLoader.Config(recipe=str(HELDOUT), infinite=False).build(
        dp_world_size=2, dp_rank=1, tokenizer=tok, seq_len=64, local_batch_size=2
    )
    n = sum(1 for _ in loader)
    assert 0 < n < 1000


def test_override_factories_swap_the_config():
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

    cfg = zt.zephon_loader(HuggingFaceTextDataLoader.Config(), recipe="r.toml", run_id="x")
    assert isinstance(cfg, zt.ZephonDataLoader.Config) and cfg.recipe == "r.toml" and cfg.infinite
    val = zt.zephon_validation_loader(HuggingFaceTextDataLoader.Config(), recipe="h.toml")
    assert not val.infinite


def test_torchtitan_02_glue_registers_specs_and_builds_a_loader():
    """TorchTitan 0.2.2 in a subprocess (it shadows 0.3 on PYTHONPATH)."""
    code = f"""
import types, zephon_torchtitan.tt02 as t
from torchtitan.components.tokenizer import HuggingFaceTokenizer
assert "llama3_zephon" in t.REGISTERED, t.REGISTERED
job = types.SimpleNamespace(
    training=types.SimpleNamespace(local_batch_size=2, global_batch_size=8, seq_len=64),
    zephon=t.ZephonSection(recipe={str(RECIPE)!r}),
)
tok = HuggingFaceTokenizer(tokenizer_path={str(ROOT / 'configs' / 'corpus')!r})
dl = t.build_zephon_dataloader(dp_world_size=2, dp_rank=0, tokenizer=tok, job_config=job)
x, y = next(iter(dl))
assert x["input"].shape == (2, 64)
job.zephon.canonical_replicas = "4"
try:
    t.build_zephon_dataloader(dp_world_size=2, dp_rank=0, tokenizer=tok, job_config=job)
except ValueError as e:
    assert "[zephon] canonical_replicas must be int" in str(e), e
else:
    raise SystemExit("a wrong type in [zephon] was accepted")
print("ok")
"""
    run_022(code)


def test_batch_sizes_come_from_the_config_never_from_the_call_stack(tok):
    """No global batch size given: the rule cannot be checked, so rank 0 is warned (and nothing is refused)."""
    with pytest.warns(RuntimeWarning, match="NOT checked"):
        loader = zt.ZephonDataLoader.Config(recipe=str(RECIPE)).build(dp_world_size=2, dp_rank=0, tokenizer=tok, seq_len=64, local_batch_size=2)
    assert next(iter(loader))[0]["input"].shape == (2, 64)


def test_zephon_trainer_fills_the_loader_with_the_jobs_final_batch_sizes(tok):
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from zephon_torchtitan.config_registry import llama3_debugmodel_zephon, on_zephon_trainer
    from zephon_torchtitan.tt03 import ZephonTrainer, batches_per_optimizer_step, fill_batch_sizes

    cfg = llama3_debugmodel_zephon()
    assert isinstance(cfg, ZephonTrainer.Config) and cfg._owner is ZephonTrainer  # config.build() makes a ZephonTrainer
    assert type(on_zephon_trainer(llama3_debugmodel())) is ZephonTrainer.Config
    cfg.training.global_batch_size, cfg.training.local_batch_size = 12, 2  # as the CLI would leave them
    fill_batch_sizes(cfg)
    assert (cfg.dataloader.global_batch_size, cfg.dataloader.training_local_batch_size) == (12, 2)
    assert cfg.validator.dataloader.global_batch_size == 0  # a validation loader has no step rule
    with pytest.raises(ValueError, match="consumes 6 batches"):
        cfg.dataloader.build(dp_world_size=2, dp_rank=0, tokenizer=tok, seq_len=64, local_batch_size=2)
    # TorchTitan's default global batch size (-1) is local x dp; under PP the loader's batch is the microbatch.
    assert batches_per_optimizer_step(-1, 4, 4, 2) == 2 and batches_per_optimizer_step(-1, 4, 1, 2) == 8
    assert batches_per_optimizer_step(16, 0, 2, 2) == 8 and batches_per_optimizer_step(0, 0, 2, 2) is None


@pytest.mark.parametrize("bad", [0, -2, 2.5, True])
def test_snapshot_interval_is_refused_unless_a_positive_integer(tok, bad):
    with pytest.raises(ValueError, match="snapshot_every_n_steps"):
        zt.ZephonDataLoader.Config(recipe=str(RECIPE), global_batch_size=8).build(
            dp_world_size=2, dp_rank=0, tokenizer=tok, seq_len=64, local_batch_size=2, snapshot_every_n_steps=bad)


def test_snapshot_interval_is_honoured_a_checkpoint_between_snapshots_resumes_exactly(tok):
    """Zephon's state is exact after every batch, so a checkpoint off the snapshot interval loses nothing."""
    def make():
        return zt.ZephonDataLoader.Config(recipe=str(RECIPE), global_batch_size=8).build(
            dp_world_size=2, dp_rank=1, tokenizer=tok, seq_len=64, local_batch_size=2, snapshot_every_n_steps=4)

    a = make()
    it = iter(a)
    for _ in range(3):  # not a multiple of the interval
        next(it)
    sd = a.state_dict()
    expected = [next(it)[0]["input"] for _ in range(3)]
    b = make()
    b.load_state_dict(sd)
    it_b = iter(b)
    got = [next(it_b)[0]["input"] for _ in range(3)]
    assert all(torch.equal(x, y) for x, y in zip(got, expected))
