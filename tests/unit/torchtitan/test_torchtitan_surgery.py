"""A recipe's ``[surgery]`` table in TorchTitan's loader (issue #35): journaled once into the restored (or fresh)
pipeline, the lanes skipping the steps' batches, refused where the trainer would train the next batches as the
skipped steps (a plain Trainer, TorchTitan 0.2, live mode). The launches (ZephonTrainer running no training for a
skipped step) are tests/e2e/test_surgery_torchtitan_e2e.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from torchtitan.components.tokenizer import HuggingFaceTokenizer  # noqa: E402
from torchtitan_cpu.runs import surgery_recipe  # noqa: E402
from tt022 import run_022  # noqa: E402

import zephon_torchtitan as zt  # noqa: E402
from zephon_core import StateError  # noqa: E402
from zephon_core.checkpoint.surgery import Skip  # noqa: E402
from zephon_core.integration import IntegrationError  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
STEP = 4  # batches a step: global 8 / local 2, over 4 lanes (1 a lane)
JOURNALED = "surgery: steps 2..3 skipped (4 batches a step), journaled in the loader state"


@pytest.fixture(scope="module")
def tok():
    return HuggingFaceTokenizer(tokenizer_path=str(ROOT / "configs" / "corpus"))


def _loader(tok, recipe, dp=1, trainer_skips=True, **cfg):
    loader = zt.ZephonDataLoader.Config(recipe=str(recipe), global_batch_size=8, **cfg).build(
        dp_world_size=dp, dp_rank=0, tokenizer=tok, seq_len=64, local_batch_size=2)
    if trainer_skips:
        loader._stream.skips_refused = None  # as ZephonTrainer sets it
    return loader


def _labels(loader, n):
    it = iter(loader)
    return [next(it)[1].tolist() for _ in range(n)]


def test_a_fresh_run_skips_the_steps_batches_and_a_resume_journals_nothing_again(tok, tmp_path, caplog):
    plain, skipping = surgery_recipe(tmp_path, None), surgery_recipe(tmp_path, "2..3")
    want = _labels(_loader(tok, plain), 5 * STEP)
    caplog.set_level(logging.INFO, logger="zephon_torchtitan")
    loader = _loader(tok, skipping)
    assert loader._stream.skip_at(2) == Skip(2, 3, 1) and loader._stream.skip_at(4) is None
    it = iter(loader)
    got = [next(it)[1].tolist() for _ in range(2 * STEP)]
    assert got == want[:STEP] + want[3 * STEP:4 * STEP], "after step 1 comes step 4"
    assert caplog.text.count(JOURNALED) == 1
    state = loader.state_dict()

    caplog.clear()
    resumed = _loader(tok, skipping, dp=2)  # the first of two data-parallel ranks, the table still in the recipe
    resumed.load_state_dict(state)
    assert JOURNALED not in caplog.text and "from dp=1 to dp=2" in caplog.text
    assert resumed._stream.surgery().skips == (Skip(2, 3, 1),)
    assert _labels(resumed, 2) == [want[4 * STEP], want[4 * STEP + 1]]  # step 5: lanes 0 and 1 (this rank's)


def test_the_table_is_journaled_after_a_restore_and_refused_past_its_steps(tok, tmp_path, caplog):
    plain, skipping = surgery_recipe(tmp_path, None), surgery_recipe(tmp_path, "2..3")
    before = _loader(tok, plain)
    _labels(before, STEP)
    caplog.set_level(logging.INFO, logger="zephon_torchtitan")
    resumed = _loader(tok, skipping)
    resumed.load_state_dict(before.state_dict())
    assert caplog.text.count(JOURNALED) == 1 and resumed._stream.skip_at(3) == Skip(2, 3, 1)
    _labels(before, STEP)  # step 2 delivered: too late to skip it
    with pytest.raises(StateError, match=r"surgery: cannot skip steps 2..3: lane 0 already delivered 2 batches"):
        _loader(tok, skipping).load_state_dict(before.state_dict())


def test_a_trainer_that_trains_every_step_is_refused_at_the_first_batch(tok, tmp_path):
    loader = _loader(tok, surgery_recipe(tmp_path, "2..3"), trainer_skips=False)
    with pytest.raises(IntegrationError, match=r"journal skips steps 2..3, but TorchTitan's Trainer would train .* "
                                               r"run the job on zephon_torchtitan.ZephonTrainer"):
        next(iter(loader))
    assert next(iter(_loader(tok, surgery_recipe(tmp_path, None), trainer_skips=False))), "no skip: no refusal"


def test_live_mode_refuses_a_surgery_table(tok, tmp_path):
    refused = (r"surgery: a \[surgery\] table \(skip_steps, quarantine\) is refused in live mode \(torchft\): .* "
               r"a run without torchft \(--module zephon_torchtitan")
    with pytest.raises(IntegrationError, match=refused):
        _loader(tok, surgery_recipe(tmp_path, "2..3"), replica_group=0)


def test_live_mode_refuses_a_journaled_skip_still_ahead_and_starts_past_one(tok, tmp_path):
    from zephon_torchtitan import ft

    loader = _loader(tok, surgery_recipe(tmp_path, "2..3"))
    loader._stream.surgery()  # journaled, as before a fresh run's first batch: steps 2..3 are ahead
    problems = ft.live_start_problems(loader._stream)
    assert len(problems) == 1 and problems[0].startswith("the loader state's surgery journal skips steps 2..3, which "
                                                         "live mode (torchft) cannot honour")
    it = iter(loader)
    for _ in range(2 * STEP):  # steps 1 and 4: the lanes are past the skip
        next(it)
    past = _loader(tok, surgery_recipe(tmp_path, None))
    past.load_state_dict(loader.state_dict())
    assert ft.live_start_problems(past._stream) == []


def test_torchtitan_02_refuses_a_skip_at_the_first_batch_naming_the_fix(tmp_path):
    recipe = surgery_recipe(tmp_path, "2..3")
    code = f"""
import types, zephon_torchtitan.tt02 as t
from torchtitan.components.tokenizer import HuggingFaceTokenizer
from zephon_core.integration import IntegrationError
job = types.SimpleNamespace(training=types.SimpleNamespace(local_batch_size=2, global_batch_size=8, seq_len=64),
                            zephon=t.ZephonSection(recipe={str(recipe)!r}))
tok = HuggingFaceTokenizer(tokenizer_path={str(ROOT / 'configs' / 'corpus')!r})
try:
    next(iter(t.build_zephon_dataloader(dp_world_size=1, dp_rank=0, tokenizer=tok, job_config=job)))
except IntegrationError as e:
    assert "skips steps 2..3, but TorchTitan 0.2's trainer cannot leave a step untrained" in str(e), e
    assert "--module zephon_torchtitan (ZephonTrainer)" in str(e) and "\\n" not in str(e), e
else:
    raise SystemExit("TorchTitan 0.2 took a skip")
print("ok")
"""
    run_022(code)


def test_a_quarantine_in_the_table_needs_no_skipping_trainer(tok, tmp_path, caplog):
    recipe = surgery_recipe(tmp_path, None)
    recipe.write_text(recipe.read_text() + '\n[surgery]\nquarantine = ["stdlib_docs.jsonl#3"]\n')
    caplog.set_level(logging.INFO, logger="zephon_torchtitan")
    loader = _loader(tok, recipe, trainer_skips=False)
    assert next(iter(loader))
    (q,) = loader._stream.pipeline.surgery.quarantines
    assert q.documents == (("stdlib_docs.jsonl", 3),) and "quarantined" in caplog.text
