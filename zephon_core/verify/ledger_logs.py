"""The ledger from the run's batch audit logs alone: no pipeline, no corpus read, no tokenizer.

The lines of the present log format say which documents each batch held (``integration.batch_log``: the
``rows`` field, the batch's ``Batch.segments``). The checkpoint state says which batches the ledger holds: every
lane's batches below its ``delivered`` count, less the steps its surgery journal skipped. Each of those must be
in the logs, with its rows; a batch several ranks logged (tensor- or pipeline-parallel peers, a rank that
trained it again after a resume or a torchft retry) must have the same digest, and the same rows where its lines
say them, everywhere (after a rollback, the abandoned launch's lines are set aside first: ``log_timelines``).
Logged batches the state does not hold (trained after the state was taken, or before a
rollback in steps the journal then skipped) are left out and named, each once, in ``Ledger.extras``: logs that
run on past the checkpoint are the usual case, not an error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from zephon_core.errors import DataError
from zephon_core.integration.batch_log import LoggedBatch, decode_rows
from zephon_core.sources.base import Source
from zephon_core.verify.ledger import Ledger, Plan, ledger_of, plan_of


def carry_rows(logged: Iterable[tuple[str, LoggedBatch]]) -> bool:
    """Whether any line of the logs says its batch's rows (then the ledger is built from them)."""
    return any(b.rows for _, b in logged)


def ledger_from_logs(logged: Iterable[tuple[str, LoggedBatch]], state: Mapping[str, Any], batches_per_step: int,
                     sources: Sequence[Source], dp_degree: int | None = None) -> Ledger:
    """The ledger of the run ``state`` is a checkpoint of, from its audit logs' ``(file, line)`` pairs; ``sources``
    are the recipe's (their names, and their raw documents when a content hash is asked for). A batch the state
    holds that no line gives with its rows, or two lines of one batch that disagree, is a ``DataError`` naming the
    lane, the batch and the file(s)."""
    plan = plan_of(state, batches_per_step, dp_degree)
    kept: dict[tuple[int, int], tuple[str, LoggedBatch]] = {}
    extras: dict[tuple[int, int], str] = {}
    for where, b in logged:
        key = (b.lane, b.lane_index)
        if not plan.owes(*key):
            extras.setdefault(key, f"lane {b.lane} batch {b.lane_index} ({where})")
            continue
        had = kept.get(key)
        if had is None or (b.rows and not had[1].rows):
            if had is not None:
                _agree(had, (where, b))
            kept[key] = (where, b)
        else:
            _agree(had, (where, b))
    _check_complete(plan, kept)
    order = sorted(kept)
    heads = [" ".join(map(str, plan.head(*key))) + " " for key in order]
    table = decode_rows((kept[key][1].rows for key in order), heads)
    digests = {key: kept[key][1].digest for key in order}
    return ledger_of(table, sources, digests, "logs", list(extras.values()))


def _agree(had: tuple[str, LoggedBatch], new: tuple[str, LoggedBatch]) -> None:
    (w0, a), (w1, b) = had, new
    what = "digest" if a.digest != b.digest else "rows" if a.rows and b.rows and a.rows != b.rows else None
    if what is not None:
        raise DataError(f"lane {a.lane} batch {a.lane_index}: its {what} in {w0} and in {w1} differ, in lines of one "
                        "launch (or of an earlier format, without one): a line was altered, or these logs are not of "
                        "one run")


def _check_complete(plan: Plan, kept: Mapping[tuple[int, int], tuple[str, LoggedBatch]]) -> None:
    """Every batch the state holds is kept with its rows (else the first missing is named)."""
    owed = plan.owed()
    with_rows = sum(1 for _, b in kept.values() if b.rows)
    if with_rows == owed:
        return
    for lane in sorted(plan.wanted):
        for index in range(plan.wanted[lane]):
            if not plan.owes(lane, index):
                continue
            got = kept.get((lane, index))
            if got is None or not got[1].rows:
                said = "in no log" if got is None else f"only in lines that do not say its rows ({got[0]})"
                raise DataError(f"lane {lane} batch {index} (step {plan.head(lane, index)[0]}) is {said}: "
                                f"{owed - with_rows} of the state's {owed} batches are missing from the logs; "
                                "give every rank's log, or build the ledger by replay (--replay)")

