"""Megatron's start-up is settings -> plan -> refuse (issue #33): one ``prepare(args)`` asks the core for the plan
once instead of going back and forth between the adapter's files and the core's door. Measured by
``tests/support/stays.py`` (``python tests/support/stays.py --rooms`` shows every stay): 41 stays in 7 files
(34 returns) before the plan carried the step rules, 25 after (11 of them the core resolving the plan)."""

from __future__ import annotations

import pytest
from support.stays import prepare_stays, trace_stays

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

MAX_STAYS = 25


def test_the_tracer_counts_every_move_between_files_and_each_return():
    from zephon_megatron import args as zargs
    from zephon_megatron import loader

    # args; loader (prepare) -> args (Settings.selected) -> loader; args: five stays in two files, three returns.
    stays = trace_stays(lambda: [zargs.is_requested(object()), loader.prepare(object()), zargs.is_requested(object())])
    assert [r.rsplit("/", 1)[1] for r in stays.rooms] == ["args.py", "loader.py", "args.py", "loader.py", "args.py"]
    assert (stays.stays, stays.files, stays.returns) == (5, 2, 3)


def test_prepare_asks_the_core_for_one_plan_and_moves_between_files_a_bounded_number_of_times(tmp_path):
    stays = prepare_stays(tmp_path)
    assert stays.stays <= MAX_STAYS, "prepare(args) went back and forth:\n" + "\n".join(stays.rooms)
    # Into the core three times: for the plan, for its rules, to refuse.
    trips = sum(1 for a, b in zip(stays.rooms, stays.rooms[1:]) if a.startswith("integrations/") and
                b.startswith("zephon_core/"))
    assert trips <= 3, "\n".join(stays.rooms)
