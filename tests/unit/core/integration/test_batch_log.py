"""``audited(batches, rank)``: the one way the adapters write the batch log (``ZEPHON_BATCH_LOG``)."""

from __future__ import annotations

from zephon_core import MemorySource, Pipeline, StaticMixture
from zephon_core.integration import BATCH_LOG_ENV, LoggedBatch, audited, log_identity, log_line, read_batch_log


def _pipeline() -> Pipeline:
    src = MemorySource([[1, 2, 3]] * 20, name="m")
    return Pipeline(StaticMixture([src], seed=0, chunk_size=4)).pack(4).batch(1).options(reader_threads=0, readahead=0)


def test_audited_logs_each_batch_as_it_is_taken_to_the_ranks_file(tmp_path, monkeypatch):
    monkeypatch.setenv(BATCH_LOG_ENV, str(tmp_path / "logs" / "batches-{rank}.log"))
    batches = audited(_pipeline(), 3)
    path = tmp_path / "logs" / "batches-3.log"
    assert path.read_text() == ""  # opened at once, before the first batch
    taken = [next(batches) for _ in range(4)]
    assert path.read_text() == "".join(log_line(b) for b in taken)
    assert [(b.lane, b.lane_index, b.digest) for b in read_batch_log(path)] == [
        (b.lane, b.lane_index, b.digest) for b in taken]
    batches.close()
    assert batches.log is None


def test_audited_without_the_variable_only_passes_the_batches_on(monkeypatch):
    monkeypatch.delenv(BATCH_LOG_ENV, raising=False)
    batches = audited(iter(_pipeline()), 0)
    assert batches.log is None
    first = next(batches)
    assert first.digest == next(iter(_pipeline())).digest
    batches.close()


def test_one_writer_for_steps_cut_one_after_another_pads_skipped(tmp_path, monkeypatch):
    """A live trainer's shape: (batch or None, weight) pairs, each step's cut into the log opened once."""
    monkeypatch.setenv(BATCH_LOG_ENV, str(tmp_path / "b-{rank}.log"))
    batches = list(zip(iter(_pipeline()), range(3)))
    cut = audited((), 1, batch_of=lambda item: item[0])
    first = list(cut.over([(batches[0][0], 1.0), (None, 0.0)]))
    second = list(cut.over([(batches[1][0], 1.0), (batches[2][0], 1.0)]))
    cut.close()
    assert [w for _, w in first + second] == [1.0, 0.0, 1.0, 1.0]
    assert (tmp_path / "b-1.log").read_text() == "".join(log_line(b) for b, _ in batches)


def test_a_batch_known_by_its_identity_alone_writes_a_line_of_the_first_format(tmp_path, monkeypatch):
    monkeypatch.setenv(BATCH_LOG_ENV, str(tmp_path / "b-{rank}.log"))
    batch = next(iter(_pipeline()))
    full = next(iter(read_batch_log_of(tmp_path, batch)))
    assert log_line(full) == log_line(batch)  # a logged batch writes back the line it was read from
    peer = audited([{"meta": LoggedBatch.identity(batch.lane, batch.lane_index, batch.digest)}], 2,
                   batch_of=lambda mb: mb["meta"])
    next(peer)
    peer.close()
    (line,) = read_batch_log(tmp_path / "b-2.log")
    assert (line.lane, line.lane_index, line.digest, line.stage) == (batch.lane, batch.lane_index, batch.digest, -1)


def read_batch_log_of(folder, batch):
    path = folder / "one.log"
    path.write_text(log_line(batch))
    return read_batch_log(path)


def test_every_line_carries_the_run_and_launch_and_a_peer_writes_the_run_its_sender_named(tmp_path, monkeypatch):
    """Issue #40: a line names its run (the definition's ``run_fingerprint``) and launch, and checks itself."""
    monkeypatch.setenv(BATCH_LOG_ENV, str(tmp_path / "b-{rank}.log"))
    identity = log_identity(_pipeline().definition())
    batches = audited(_pipeline(), 0, identity=identity)
    taken = [next(batches) for _ in range(3)]
    batches.close()
    read = list(read_batch_log(tmp_path / "b-0.log"))
    assert {(b.run, b.launch) for b in read} == {tuple(identity)} and len(identity.run) == 16
    assert (tmp_path / "b-0.log").read_text() == "".join(log_line(b, identity) for b in taken) == "".join(
        log_line(b) for b in read)  # a line read back writes itself again, identity and checksum included
    peer = audited([LoggedBatch.identity(taken[0].lane, taken[0].lane_index, taken[0].digest, identity.run)], 1)
    next(peer)
    peer.close()
    (line,) = read_batch_log(tmp_path / "b-1.log")
    assert (line.run, line.launch, line.stage) == (identity.run, identity.launch, -1)
