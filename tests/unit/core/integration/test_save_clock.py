"""A steered mixture checkpoints only at logged steps (``rules.SaveClock``, ``unlogged_saves``): the adapters hand
the controller the per-source loss at logged steps only, so a checkpoint between two would resume without the
losses since the last one (docs/mixing.md, Limits)."""

from __future__ import annotations

from zephon_core.integration import SaveClock, unlogged_saves


def _tt(interval: int, log_freq: int, last: int | None = None) -> SaveClock:
    return SaveClock("metrics.log_freq", log_freq, every=(("checkpoint.interval", interval),), last=last,
                     first_logged=True)


def test_a_periodic_checkpoint_off_the_log_is_refused_naming_both_settings_and_the_fix():
    (line,) = unlogged_saves(_tt(25, 10))
    assert line.startswith("checkpoint.interval = 25 saves a checkpoint at step 25, which metrics.log_freq = 10 "
                           "does not log")
    assert line.endswith("set checkpoint.interval to a multiple of metrics.log_freq (e.g. 30)")
    assert unlogged_saves(_tt(30, 10)) == [] and unlogged_saves(_tt(7, 1)) == []


def test_a_first_logged_step_rescues_only_step_one():
    # checkpoint.interval = 1 saves at step 1 (logged whatever log_freq), then at step 2, which log_freq 10 is not.
    (line,) = unlogged_saves(_tt(1, 10))
    assert "at step 2," in line
    assert unlogged_saves(_tt(1, 10, last=1)) == [], "a one-step run saves only at the logged step 1"
    assert "at step 3," in unlogged_saves(_tt(1, 2))[0]
    assert unlogged_saves(SaveClock("--log-interval", 10, every=(("--save-interval", 1),))), "no first step: refused"


def test_a_periodic_checkpoint_past_the_last_step_never_happens():
    assert unlogged_saves(_tt(25, 10, last=24)) == []
    assert unlogged_saves(_tt(25, 10, last=25))


def test_a_checkpoint_at_a_fixed_step_names_what_saves_it_and_its_fix():
    c = SaveClock("--log-interval", 10, at=(("--train-iters = 25", 25, "set --train-iters to a multiple of 10"),
                                            ("--train-iters = 30", 30, "never said")), step="iteration")
    (line,) = unlogged_saves(c)
    assert line.startswith("--train-iters = 25 saves a checkpoint at iteration 25, which --log-interval = 10 does "
                           "not log: a steered mixture (mixing) resumed there would lose the per-source loss of the "
                           "iterations since the last logged one")
    assert line.endswith("; set --train-iters to a multiple of 10")
