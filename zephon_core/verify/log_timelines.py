"""A run's batch audit logs read as one timeline: each line checked, a rolled-back launch's batches set aside.

Every line is checked as ``integration.batch_log.numbered_lines`` reads it (torn, damaged, binary, a file of two
runs or formats: refused naming the file and line), and, given the run (``run_fingerprint`` of the state's
definition), a line of another run is refused naming its file and line.

A rollback (a resume from an earlier checkpoint, logging to the same files) appends a second launch's lines
after the first's. The launches are ordered by their place in the files (a launch's lines come after those of
every launch before it in each file it shares with them); launches that share no file are ordered by their labels,
which begin with their start time. For a batch ``(lane, lane_index)`` that several launches logged with different
content (digest, or rows where both lines say them), the latest launch's lines are the run's; the earlier
launches' lines of it are the abandoned attempt's, set aside and counted per launch (``RunLogs.abandoned``). Lines of
an earlier format carry no launch and are kept as they are.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from zephon_core.errors import DataError
from zephon_core.integration.batch_log import LoggedBatch, numbered_lines


@dataclass
class RunLogs:
    """The lines of a run's logs, as ``(where, batch)`` pairs (``where``: ``path line N``), the abandoned ones left
    out; ``abandoned``: per launch, its lines a later launch logged again with other content; ``unchecked``: lines
    of an earlier format (no identity or checksum to check)."""

    logged: list[tuple[str, LoggedBatch]]
    files: int
    abandoned: dict[str, int] = field(default_factory=dict)
    unchecked: int = 0

    def checked(self) -> str:
        """What reading checked, in words (for the ledger's last line)."""
        n = len(self.logged) - self.unchecked
        said = f"{n} lines' run identities and checksums verified" if n else "no line carries a run identity"
        return said + (f"; {self.unchecked} lines of an earlier format, unchecked" if n and self.unchecked else "")


def read_run_logs(paths: Sequence[str], run: str | None = None) -> RunLogs:
    """Every batch of the audit logs at ``paths``, one timeline (the module docstring says how); ``run``: the run
    every line must be of (``run_fingerprint``), None for any one run."""
    lines: list[tuple[str, int, LoggedBatch]] = []
    order: dict[str, list[str]] = {}  # per file, its launches in the order their lines came
    for path in paths:
        launches: list[str] = []
        for n, b in numbered_lines(path):
            if run is not None and b.run and b.run != run:
                raise DataError(f"{path} line {n}: a line of run {b.run}, not of the state's run {run}: another "
                                "run's log (or the state of another run); give the logs this run wrote")
            if b.launch and (not launches or launches[-1] != b.launch):
                if b.launch in launches:
                    raise DataError(f"{path} line {n}: launch {b.launch} again after launch {launches[-1]}: a "
                                    "launch's lines are not together; the file was edited or its lines mixed")
                launches.append(b.launch)
            lines.append((path, n, b))
        order[path] = launches
    rank = _launch_order(order)
    kept, abandoned = _timeline(lines, rank)
    unchecked = sum(1 for _, b in kept if not b.launch)
    return RunLogs(kept, len(paths), abandoned, unchecked)


def _launch_order(order: dict[str, list[str]]) -> dict[str, int]:
    """Each launch's place in time: after every launch before it in a file, else by label."""
    after: dict[str, set[str]] = defaultdict(set)
    before_count: dict[str, int] = {}
    for launches in order.values():
        for launch in launches:
            before_count.setdefault(launch, 0)
        for a, b in zip(launches, launches[1:]):
            if b not in after[a]:
                after[a].add(b)
                before_count[b] += 1
    ready = [launch for launch, k in before_count.items() if k == 0]
    heapq.heapify(ready)
    rank: dict[str, int] = {}
    while ready:
        launch = heapq.heappop(ready)
        rank[launch] = len(rank)
        for b in after[launch]:
            before_count[b] -= 1
            if before_count[b] == 0:
                heapq.heappush(ready, b)
    if len(rank) < len(before_count):
        stuck = sorted(set(before_count) - set(rank))
        where = [p for p, launches in order.items() if set(launches) & set(stuck)]
        raise DataError(f"launches {', '.join(stuck)} come in one order in one file and in another order in another "
                        f"({', '.join(where[:2])}): these files are not of one run's timeline")
    return rank


def _same(a: LoggedBatch, b: LoggedBatch) -> bool:
    return a.digest == b.digest and (not a.rows or not b.rows or a.rows == b.rows)


def _timeline(lines: list[tuple[str, int, LoggedBatch]], rank: dict[str, int]
              ) -> tuple[list[tuple[str, LoggedBatch]], dict[str, int]]:
    """The lines the latest launch of each batch agrees with, and per launch the count of its lines set aside."""
    if len(rank) < 2:  # one launch (or none): nothing was rolled back
        return [(f"{path} line {n}", b) for path, n, b in lines], {}
    latest: dict[tuple[int, int], LoggedBatch] = {}
    for _, _, b in lines:
        key = (b.lane, b.lane_index)
        had = latest.get(key)
        if b.launch and (had is None or rank[b.launch] > rank[had.launch] or
                         (b.launch == had.launch and b.rows and not had.rows)):
            latest[key] = b
    kept: list[tuple[str, LoggedBatch]] = []
    abandoned: dict[str, int] = defaultdict(int)
    for path, n, b in lines:
        won = latest.get((b.lane, b.lane_index))
        if b.launch and won is not None and won.launch != b.launch and not _same(won, b):
            abandoned[b.launch] += 1
            continue
        kept.append((f"{path} line {n}", b))
    return kept, dict(abandoned)
