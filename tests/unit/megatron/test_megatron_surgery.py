"""Skipped steps under Megatron (zephon_megatron.surgery): the journal the recipe's [surgery] and
--iterations-to-skip make, the same on every rank, kept in step with Megatron's list; a journaled step's
dummy step reads nothing. The launches are in tests/e2e/test_megatron_surgery_e2e.py."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from zephon_core.checkpoint.surgery import Skip, surgery_journal_of
from zephon_core.pipeline.surgery import SurgeryRequest

torch = pytest.importorskip("torch")

from test_megatron_loader import _pipeline, _resumed, _stream  # noqa: E402

from zephon_megatron import state as ls  # noqa: E402
from zephon_megatron.iterators import skip_step  # noqa: E402
from zephon_megatron.schedule import BatchSchedule  # noqa: E402
from zephon_megatron.surgery import journal_in, ranges_of, skips_at_start  # noqa: E402
from zephon_megatron.validate import ZephonMegatronError  # noqa: E402

RECIPE = SurgeryRequest(skips=((3, 4),), where="r.toml: surgery")


def _args(iteration=0, skip=()):
    return SimpleNamespace(iteration=iteration, iterations_to_skip=list(skip), global_batch_size=8, micro_batch_size=2)


def _state_after_skip():
    """A state at iteration 5 of a run that skipped steps 3..4 (4 micro-batches a step, 4 lanes)."""
    p = _pipeline()
    p.skip_steps(3, 4, 4)
    batches = [b for _, b in zip(range(12), p)]
    assert [b.lane_index for b in batches[8:]] == [4] * 4  # steps 1, 2, then 5
    return p.checkpoint()


def test_ranges_of_groups_contiguous_steps():
    assert ranges_of([9, 3, 5, 4, 4]) == ((3, 5), (9, 9))
    assert ranges_of([]) == ()


def test_the_recipe_and_the_flag_are_journaled_and_every_journaled_step_joins_megatrons_list():
    args = _args(skip=[7, 6, 1])
    s = skips_at_start(args, RECIPE, None, ramps=False, canonical_replicas=4)
    assert s.batches_per_step == 4 and s.flag.skips == ((1, 1), (6, 7))
    assert args.iterations_to_skip == [1, 3, 4, 6, 7]
    p = _pipeline()
    lines = journal_in(p, s)
    assert p.surgery.skips == (Skip(1, 1, 1), Skip(3, 4, 1), Skip(6, 7, 1))
    assert lines[0] == "zephon: r.toml: surgery: steps 3..4 skipped (4 batches a step), journaled in the loader state"
    assert lines[1].startswith("zephon: --iterations-to-skip: steps 1..1 skipped") and len(lines) == 3


def test_a_resume_journals_nothing_twice_and_ignores_flagged_steps_already_past():
    state = _state_after_skip()
    args = _args(iteration=5, skip=[2, 3, 4, 6])
    s = skips_at_start(args, RECIPE, state, ramps=False, canonical_replicas=4)
    assert s.flag.skips == ((6, 6),) and args.iterations_to_skip == [2, 3, 4, 6]
    p = _pipeline()
    p.restore(state)
    assert len(journal_in(p, s)) == 1 and p.surgery.skips == (Skip(3, 4, 1), Skip(6, 6, 1))
    # A journal in the state alone (zephon skip, an earlier recipe) reaches Megatron's list too.
    state = {**state, **p.checkpoint()}
    args = _args(iteration=5)
    skips_at_start(args, SurgeryRequest(), state, ramps=False, canonical_replicas=4)
    assert args.iterations_to_skip == [6] and surgery_journal_of(state).skip_at(6)


def test_a_skip_of_delivered_steps_is_refused_on_every_rank_naming_who_asked():
    with pytest.raises(ZephonMegatronError, match=r"^zephon: r.toml: surgery: cannot skip steps 4..6: lane 0 already"):
        skips_at_start(_args(iteration=5), SurgeryRequest(((4, 6),), where="r.toml: surgery"), _state_after_skip(),
                       ramps=False, canonical_replicas=4)
    with pytest.raises(ZephonMegatronError, match="--iterations-to-skip: batches per step 4 must be a positive"):
        skips_at_start(_args(skip=[2]), SurgeryRequest(), None, ramps=False, canonical_replicas=8)


def test_under_a_ramp_the_flag_reads_and_drops_and_a_journaled_skip_is_refused():
    args = _args(skip=[2])
    s = skips_at_start(args, SurgeryRequest(documents=(("m", 1),)), None, ramps=True, canonical_replicas=4)
    assert not s.recipe.skips and s.recipe.documents == (("m", 1),) and not s.flag and args.iterations_to_skip == [2]
    assert "read and dropped, not journaled" in journal_in(_pipeline(), s)[0]
    with pytest.raises(ZephonMegatronError, match="r.toml: surgery skips steps, but under a batch-size ramp"):
        skips_at_start(_args(), RECIPE, None, ramps=True, canonical_replicas=4)


def test_a_journaled_steps_dummy_step_reads_nothing_and_the_stream_saves_after_it():
    p = _pipeline()
    p.skip_steps(2, 2, 4)
    stream, readers = _stream(p, bps=4, readers=2)
    rerun = pytest.importorskip("megatron.core.rerun_state_machine")
    a, b = (rerun.RerunDataIterator(r) for r in readers)  # as Megatron's training loop hands them over
    first = [next(a) for _ in range(4)] + [next(b) for _ in range(4)]
    skip_step([a, b], 4)  # step 2: journaled, nothing read, the counter moves on
    assert stream.produced == 4 and stream.iteration == 2
    third = [next(a) for _ in range(4)]
    assert [m.meta.lane_index for m in first[:4] + third] == [0] * 4 + [2] * 4
    for _ in range(4):
        next(b)
    st = ls.decode(readers[0].save_state(), "mem")
    assert (st.iteration, st.delivered) == (3, 12)
    # A step that is not journaled is read and dropped, as before.
    skip_step([a, b], 4)
    assert stream.produced == 12 and stream.iteration == 4
    resumed, (c,) = _resumed(st.state, schedule=BatchSchedule.constant(8, 2), iteration=3, consumed=24)
    assert [next(c).meta.lane_index for _ in range(4)] == [3] * 4


def test_a_save_right_after_journaled_skips_is_kept_and_resumes_past_them(tmp_path):
    """The last iterations of a run skipped: the lanes have not moved past those steps yet (they do when the next
    step is read), so the state holds fewer delivered batches than Megatron's consumed samples, and both the save's
    and the resume's checks count the journaled steps the lanes have still to pass."""
    p = _pipeline()
    p.skip_steps(2, 3, 4)
    stream, (a,) = _stream(p, bps=4)
    for _ in range(4):
        next(a)
    skip_step(a, 4)
    skip_step(a, 4)
    st = ls.decode(a.save_state(), "mem")
    assert (st.iteration, st.delivered) == (3, 4)  # step 1's batches; steps 2 and 3 not passed yet
    path = ls.state_file(str(tmp_path), 3, 0, pipeline_parallel=False)
    os.makedirs(os.path.dirname(path))
    torch.save({ls.MEGATRON_KEY: ls.encode(st.state, iteration=3, batches_per_step=4)}, path)
    got = ls.load_for_iteration(str(tmp_path), 3, 0, batches_per_step=4, pipeline_parallel=False, delivered=12,
                                consumed_samples=24)
    resumed, (c,) = _resumed(got.state, schedule=BatchSchedule.constant(8, 2), iteration=3, consumed=24)
    assert [next(c).meta.lane_index for _ in range(4)] == [3] * 4  # step 4's batches, past the skip
    with pytest.raises(ZephonMegatronError, match="holds 4 delivered micro-batches, but .* = 8"):
        ls.load_for_iteration(str(tmp_path), 3, 0, batches_per_step=4, pipeline_parallel=False, delivered=16,
                              consumed_samples=32)
