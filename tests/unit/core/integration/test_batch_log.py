"""``audited(batches, rank)``: the one way the adapters write the batch log (``ZEPHON_BATCH_LOG``)."""

from __future__ import annotations

from zephon_core import MemorySource, Pipeline, StaticMixture
from zephon_core.integration import BATCH_LOG_ENV, audited, log_line, read_batch_log


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
