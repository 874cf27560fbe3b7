"""Batch audit logs that cannot be trusted are refused (issue #40): another run's lines, a torn last line, a damaged
line, a binary file, a file mixing runs or formats, each named by file (as given) and line; a rollback's appended
launch is read as the latest timeline, the abandoned attempt's batches counted per launch."""

from __future__ import annotations

import json

import pytest

from zephon_core import MemorySource, Pipeline, StaticMixture
from zephon_core.errors import DataError
from zephon_core.integration.batch_log import LogIdentity, log_identity, log_line, run_fingerprint
from zephon_core.pipeline.surgery import quarantined_state
from zephon_core.verify.ledger import COLUMNS, build_ledger
from zephon_core.verify.ledger_logs import ledger_from_logs
from zephon_core.verify.log_timelines import read_run_logs
from zephon_core.verify.simulate import Phase, run_phase

DOCS = [[1 + i % 7] * (3 + i % 5) for i in range(60)]
C = 4


def _make(dp_degree: int, dp_group_id: int, seed: int = 5) -> Pipeline:
    ws = StaticMixture([MemorySource(DOCS, name="m")], seed=seed, chunk_size=4)
    return (Pipeline(ws).pack(8).shuffle(3, seed=2).batch(2)
            .options(canonical_replicas=C, dp_degree=dp_degree, dp_group_id=dp_group_id, prefetch=0))


def _logged(folder, G: int, steps: int, state=None, launch: str = "20250101T000000Z-1", make=_make):
    """Run ``steps`` steps on ``G`` groups from ``state``, appending each group's lines to ``folder/b-{g}.log``
    as launch ``launch``; the state after them."""
    identity = LogIdentity(run_fingerprint(make(1, 0).definition()), launch)
    files = {g: (folder / f"b-{g}.log").open("a") for g in range(G)}
    _, state = run_phase(make, Phase(G, steps), C, state, on_batch=lambda g, b: files[g].write(log_line(b, identity)))
    for f in files.values():
        f.close()
    return state


def _paths(folder) -> list[str]:
    return sorted(str(p) for p in folder.glob("b-*.log"))


def test_another_runs_logs_are_refused_naming_the_file_and_line(tmp_path):
    state = _logged(tmp_path, 2, 2, make=lambda G, g: _make(G, g, seed=6))  # another run: same shape, other seed
    ours = json.loads(json.dumps(state))
    ours["definition"] = _make(1, 0).definition()
    assert run_fingerprint(ours["definition"]) != run_fingerprint(state["definition"])
    with pytest.raises(DataError, match=rf"^{tmp_path}/b-0.log line 1: a line of run \w+, not of the state's run"):
        read_run_logs(_paths(tmp_path), run_fingerprint(ours["definition"]))
    assert len(read_run_logs(_paths(tmp_path), run_fingerprint(state["definition"])).logged) == 8


def test_a_torn_damaged_or_binary_log_is_refused_naming_the_file_and_line(tmp_path):
    _logged(tmp_path, 1, 3)
    path = tmp_path / "b-0.log"
    good = path.read_text()
    lines = good.splitlines(keepends=True)
    last = lines[-1]
    cut = last[:last.rindex("/") if "/" in last else last.rindex(",")]  # a crash mid-write, at a row's boundary
    for torn in (cut, last[:-1]):  # cut in its rows; or whole but for its line end
        path.write_text("".join(lines[:-1]) + torn)
        with pytest.raises(DataError, match=rf"^{path} line {len(lines)}: the last line is cut short"):
            read_run_logs([str(path)])
    fields = lines[1].split(" ")
    fields[2] = "0" * 32  # the digest edited, the checksum not
    path.write_text(lines[0] + " ".join(fields) + "".join(lines[2:]))
    with pytest.raises(DataError, match=rf"^{path} line 2: a damaged batch audit line"):
        read_run_logs([str(path)])
    path.write_bytes(b"\x00\xff\xfe binary\n")
    with pytest.raises(DataError, match=rf"^{path} line 1: not UTF-8 text"):
        read_run_logs([str(path)])
    old = lines[0].rsplit(" ", 2)[0] + "\n"  # the same batch in the format before identities
    path.write_text(old + good)
    with pytest.raises(DataError, match=rf"^{path} line 2: of run \w+, line 1 without a run .*two runs"):
        read_run_logs([str(path)])
    path.write_text(old)
    assert read_run_logs([str(path)]).unchecked == 1  # an earlier format alone still reads


def _rows(ledger):
    return [tuple(int(ledger.columns[k][i]) for k in COLUMNS) for i in range(len(ledger))]


def _rolled_back(folder, G: int, first: str, second: str):
    """Launch ``first`` trains steps 1-4; the run rolls back to its state after step 2, quarantines documents it
    read in steps 3-4 and resumes as launch ``second``, appending to the same files. The first launch's lines and
    the last state."""
    early = _logged(folder, G, 2, launch=first)
    _logged(folder, G, 2, early, launch=first)
    a_lines = read_run_logs(_paths(folder)).logged
    later = sorted({d for _, b in a_lines if b.lane_index >= 2 for d in b.stretches()[:, 2].tolist()})
    resumed = quarantined_state(_make(1, 0), json.loads(json.dumps(early)), [("m", d) for d in later[:6]])
    return a_lines, _logged(folder, G, 2, resumed, launch=second)


def test_a_rollback_appended_to_the_same_logs_reads_as_the_latest_timeline(tmp_path):
    a_lines, state = _rolled_back(tmp_path, 2, "20250101T000000Z-1", "20250102T000000Z-2")
    logs = read_run_logs(_paths(tmp_path), run_fingerprint(state["definition"]))
    assert list(logs.abandoned) == ["20250101T000000Z-1"] and 0 < logs.abandoned["20250101T000000Z-1"] <= 8
    from_logs = ledger_from_logs(logs.logged, state, C, [MemorySource(DOCS, name="m")])
    assert _rows(from_logs) == _rows(build_ledger(lambda: _make(1, 0), state, C))
    with pytest.raises(DataError, match="differ"):  # read without the timeline, the two attempts clash
        ledger_from_logs([(f"line {n}", b) for n, (_, b) in enumerate(a_lines + logs.logged)], state, C,
                         [MemorySource(DOCS, name="m")])


def test_launches_order_by_their_place_in_the_files_before_their_labels(tmp_path):
    """The second launch's label sorts first, but its lines come after the first's in a file: it is the later."""
    _rolled_back(tmp_path, 1, "z-first", "a-second")
    assert list(read_run_logs(_paths(tmp_path)).abandoned) == ["z-first"]
    identity = log_identity(_make(1, 0).definition())
    assert identity.launch == log_identity(_make(2, 1).definition()).launch  # made once per process
