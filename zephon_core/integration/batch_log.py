"""The batch audit log: one line per batch a rank trains on, for comparing runs and drawing them.

``ZEPHON_BATCH_LOG=/path/batches-{rank}.log`` (``{rank}`` is replaced by the
caller's rank) makes the framework adapters append, for every delivered batch::

    lane lane_index digest stage tokens documents rows

``stage`` is the curriculum stage the batch counts in; ``tokens`` and
``documents`` are ``source:count`` pairs joined by commas (``-`` for none):
tokens of each source in the batch's rows, and documents whose first token is
in them. ``rows`` says which documents the batch held (its ``Batch.segments``):
the rows joined by ``/`` (row 0 first), each row's stretches joined by ``,``, a
stretch being ``source.document.start.stop`` (the document's tokens
``[start, stop)`` in that row; ``-`` for a batch without any), so
``0.12.0.41,1.7.0.88/1.7.88.217`` is row 0 holding document 12 of source 0 and
the first 88 tokens of document 7 of source 1, row 1 the next 129 of it; the
ledger (``verify.ledger_logs``) is built from these without reading the corpus.
The global step of a batch is
``lane_index // (batches_per_step / canonical_replicas)`` on every topology,
so logs of runs on different numbers of ranks compare step by step.
Each line ends with whose it is and its own check::

    ... rows RUN@LAUNCH CRC

``RUN`` is the run's fingerprint (``run_fingerprint``: 16 hex digits of what the data definition keeps for
the whole run, so a steering decision or an appended stage leaves it as it was), ``LAUNCH`` the label of the
launch that wrote the line (``launch_id``: its UTC start time and process id, made once per process; a label,
never data), ``CRC`` the crc32 of the line's text before it (8 hex digits). A reader refuses a line whose
checksum does not match (altered, or torn by a crash mid-write), a last line without its line end (torn), a
file that is not UTF-8 text, and a file holding lines of two runs or of two formats, each naming the file and
line. Lines of the earlier formats (``lane lane_index digest``, the six fields before ``rows``, and the seven
without ``RUN@LAUNCH CRC``) are still read: their ``rows`` is empty in the first two, and no identity or
checksum is checked.

An adapter wraps the batches it trains on in ``audited(batches, rank, identity=log_identity(definition))``,
which logs each one as it is taken, and is the one writer of the log: items that are not batches themselves
(a live step's ``(batch, weight)`` pairs, a micro-batch received from a peer) name their batch through ``batch_of``,
and a trainer that cuts its batches step by step feeds each step's to the same log (``Audited.over``).
A peer that received only a batch's identity (a ``LoggedBatch`` without counts) writes a line of the
first format, with the run the sender's batch carries. ``read_batch_log`` reads a log back
(``numbered_lines``: with each line's number).
"""

from __future__ import annotations

import os
import re
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, NamedTuple, TextIO, TypeVar

import numpy as np

from zephon_core.batch import Batch
from zephon_core.checkpoint.state import fingerprint_of
from zephon_core.curriculum.definition import parse_definition
from zephon_core.errors import DataError

ENV = "ZEPHON_BATCH_LOG"
_ID = re.compile(r"([0-9a-f]{16})@([A-Za-z0-9._:-]{1,64})")
_CRC = re.compile(r"[0-9a-f]{8}")
_LAUNCH: list[str] = []  # this process's launch label, made at its first use


class LogIdentity(NamedTuple):
    """Whose the lines are: the run (``run_fingerprint``) and the launch that wrote them (``launch_id``)."""

    run: str
    launch: str


def run_fingerprint(definition: Mapping[str, Any]) -> str:
    """16 hex digits naming the run of a data definition (a pipeline's ``definition()``, a state's ``definition``).

    It hashes what stays the same for the whole run: the first stage's sources (names and content fingerprints)
    and weights, seed, chunking, shuffle and the operators. A steering decision or a stage appended on resume,
    with sources of its own or not (which change the definition's own fingerprint), leave it as it was, so one
    run's lines all carry it.
    """
    parsed = parse_definition(definition)
    ws = parsed.work_source
    first = ws.stages[0] if ws is not None else None
    kept: Any = definition["work_source"] if ws is None or first is None else {
        "seed": ws.seed, "chunk_size": ws.chunk_size, "exhausted": ws.exhausted, "shuffle": ws.shuffle,
        "sources": [s.definition(weight=False) for s in ws.sources if s.name in first.weights],
        "first": first.data()}
    return fingerprint_of({"work_source": kept, "ops": list(parsed.ops)})[:16]


def launch_id() -> str:
    """This process's launch label: its UTC start time and pid (``20250102T030405Z-4242``), made once; labels of
    launches that share no log file sort by their time."""
    if not _LAUNCH:
        _LAUNCH.append(time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}")
    return _LAUNCH[0]


def log_identity(definition: Mapping[str, Any]) -> LogIdentity:
    """The identity this process's lines of the run of ``definition`` carry."""
    return LogIdentity(run_fingerprint(definition), launch_id())


def open_batch_log(rank: int) -> TextIO | None:
    """The log named by ``ZEPHON_BATCH_LOG`` for ``rank``, or None when it is unset."""
    pattern = os.environ.get(ENV)
    if not pattern:
        return None
    path = pattern.replace("{rank}", str(rank))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return open(path, "a", encoding="utf-8", buffering=1)


T = TypeVar("T")


class Audited(Iterator[T], Generic[T]):
    """``items`` as they are taken, the batch of each (``batch_of``; None: a pad, not logged) written to the
    batch log first (when one is open), each line with ``identity`` (None: the run a ``LoggedBatch`` carries,
    with this process's launch); ``close()`` closes the log. ``iter(items)`` is called at the first item, not
    before."""

    def __init__(self, items: Iterable[T], log: TextIO | None,
                 batch_of: Callable[[T], Batch | LoggedBatch | None] | None = None,
                 identity: LogIdentity | None = None) -> None:
        self._items = items
        self._it: Iterator[T] | None = None
        self._batch_of = batch_of
        self.log = log
        self.identity = identity

    def __next__(self) -> T:
        if self._it is None:
            self._it = iter(self._items)
        item = next(self._it)
        if self.log is not None:
            batch: Any = item if self._batch_of is None else self._batch_of(item)
            if batch is not None:
                identity = self.identity
                if identity is None and isinstance(batch, LoggedBatch) and batch.run:
                    identity = LogIdentity(batch.run, launch_id())
                self.log.write(log_line(batch, identity))
        return item

    def over(self, items: Iterable[T]) -> Audited[T]:
        """``items`` next, into the same log (a trainer that cuts each step's batches opens the log once)."""
        self._items, self._it = items, None
        return self

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None


def audited(items: Iterable[T], rank: int, *,
            batch_of: Callable[[T], Batch | LoggedBatch | None] | None = None,
            identity: LogIdentity | None = None) -> Audited[T]:
    """``items`` (batches, or anything ``batch_of`` finds a batch or a ``LoggedBatch`` in), each logged to
    ``ZEPHON_BATCH_LOG`` for ``rank`` (opened now) as it is taken, with ``identity`` (``log_identity`` of the
    pipeline's definition; None only where the batches carry their run); unchanged when it is unset."""
    return Audited(items, open_batch_log(rank), batch_of, identity)


class LoggedBatch(NamedTuple):
    """One line of a batch audit log; ``stage`` is -1 and the counts empty in a line of the first format, ``rows``
    empty in a line of the first two (kept as the line's text: most readers never decode it); ``run`` and
    ``launch`` empty in a line of an earlier format."""

    lane: int
    lane_index: int
    digest: str
    stage: int
    tokens: dict[int, int]
    documents: dict[int, int]
    rows: str = ""
    run: str = ""
    launch: str = ""

    def stretches(self) -> np.ndarray:
        """The batch's ``(row, source, document, start, stop)`` stretches, as ``Batch.segments`` held them (none
        for a line that does not say)."""
        return decode_rows([self.rows], [""]).reshape(-1, 5)

    @classmethod
    def identity(cls, lane: int, lane_index: int, digest: str, run: str = "") -> LoggedBatch:
        """A batch known by its identity alone (its stage and counts unknown): a line of the first format, of
        ``run`` (``run_fingerprint``) when given."""
        return cls(lane, lane_index, digest, -1, {}, {}, run=run)


def _pairs(counts: np.ndarray) -> str:
    nz = np.flatnonzero(counts)
    return ",".join(f"{s}:{int(counts[s])}" for s in nz.tolist()) or "-"


def encode_rows(segments: np.ndarray) -> str:
    """The ``rows`` field of a batch's segments (the module docstring says the form)."""
    if not len(segments):
        return "-"
    rows: list[list[str]] = [[] for _ in range(int(segments[:, 0].max()) + 1)]
    for r, s, d, a, b in segments.tolist():
        rows[r].append(f"{s}.{d}.{a}.{b}")
    return "/".join(",".join(row) for row in rows)


_STRETCHES = r"(?:\d+\.\d+\.\d+\.\d+(?:,\d+\.\d+\.\d+\.\d+)*)?"
_ROWS = re.compile(rf"-|{_STRETCHES}(?:/{_STRETCHES})*")


def decode_rows(rows: Iterable[str], heads: Iterable[str]) -> np.ndarray:
    """The stretches of many ``rows`` fields as one flat int64 array, each stretch
    ``head... row source document start stop`` (``head``: that field's leading numbers, each followed by a space,
    e.g. its step and lane). One text parse for all of them: the ledger reads a run's logs at this speed."""
    parts = []
    for text, head in zip(rows, heads):
        if text and text != "-":
            for r, row in enumerate(text.split("/")):
                if row:
                    parts.append(f"{head}{r} " + row.replace(",", f" {head}{r} "))
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.fromstring(" ".join(parts).replace(".", " "), dtype=np.int64, sep=" ")


def log_line(batch: Batch | LoggedBatch, identity: LogIdentity | None = None) -> str:
    """The audit line of one delivered batch, ending with ``identity`` and the line's crc32 (the module docstring
    says the form); of a ``LoggedBatch`` without a stage (a batch's identity alone, as a peer receives it), a line
    of the first format. A ``LoggedBatch`` read back writes the line it was read from."""
    if isinstance(batch, LoggedBatch) and identity is None and batch.launch:
        identity = LogIdentity(batch.run, batch.launch)
    text = _fields(batch)
    if identity is None:
        return text + "\n"
    text += f" {identity.run}@{identity.launch}"
    return f"{text} {zlib.crc32(text.encode()):08x}\n"


def _fields(batch: Batch | LoggedBatch) -> str:
    if isinstance(batch, LoggedBatch):
        if batch.stage < 0:
            return f"{batch.lane} {batch.lane_index} {batch.digest}"
        logged = [",".join(f"{s}:{n}" for s, n in counts.items()) or "-" for counts in (batch.tokens, batch.documents)]
        rows = f" {batch.rows}" if batch.rows else ""
        return f"{batch.lane} {batch.lane_index} {batch.digest} {batch.stage} {logged[0]} {logged[1]}{rows}"
    seg = batch.segments
    tokens = np.bincount(seg[:, 1], weights=seg[:, 4] - seg[:, 3]) if len(seg) else np.zeros(0)
    documents = np.bincount(seg[seg[:, 3] == 0, 1]) if len(seg) else np.zeros(0)
    return (f"{batch.lane} {batch.lane_index} {batch.digest} {batch.stage} {_pairs(tokens)} {_pairs(documents)} "
            f"{encode_rows(seg)}")


def _parse_pairs(text: str) -> dict[int, int]:
    if text == "-":
        return {}
    return {int(s): int(n) for s, n in (pair.split(":") for pair in text.split(","))}


def _parsed(line: str) -> LoggedBatch | None:
    """The line's batch; None when it is malformed, its checksum does not match, or it is a line with an
    identity that ``parse_line`` must explain."""
    fields = line.split()
    if len(fields) in (5, 9) and _CRC.fullmatch(fields[-1]) and (found := _ID.fullmatch(fields[-2])):
        body = line.rstrip("\r\n").rsplit(" ", 1)[0]
        b = _old(fields[:-2]) if zlib.crc32(body.encode()) == int(fields[-1], 16) else None
        return None if b is None else b._replace(run=found[1], launch=found[2])
    return _old(fields)


def _old(fields: list[str]) -> LoggedBatch | None:
    try:
        if len(fields) == 3:
            return LoggedBatch(int(fields[0]), int(fields[1]), fields[2], -1, {}, {})
        if len(fields) in (6, 7) and (len(fields) == 6 or _ROWS.fullmatch(fields[6])):
            return LoggedBatch(int(fields[0]), int(fields[1]), fields[2], int(fields[3]), _parse_pairs(fields[4]),
                               _parse_pairs(fields[5]), fields[6] if len(fields) == 7 else "")
    except ValueError:
        pass
    return None


def parse_line(line: str, where: str = "batch log") -> LoggedBatch:
    """One audit line (any format); a malformed or damaged line is a ``DataError`` naming ``where``."""
    batch = _parsed(line)
    if batch is None:
        fields = line.split()
        if len(fields) in (5, 9) and _CRC.fullmatch(fields[-1]) and _ID.fullmatch(fields[-2]):
            raise DataError(f"{where}: a damaged batch audit line (its crc32 {fields[-1]} is not its text's): the "
                            "file was altered or torn mid-write; restore the file, or build the ledger by replay "
                            "(--replay)")
        raise DataError(f"{where}: not a batch audit line (want 'lane lane_index digest stage tokens documents rows "
                        f"RUN@LAUNCH CRC'): {line.strip()[:80]!r}")
    return batch


def numbered_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, LoggedBatch]]:
    """The batches of one audit log file with their line numbers, in the order the rank trained on them. A torn
    last line (no line end), a line that is not UTF-8, a damaged line, or a file mixing runs or formats is a
    ``DataError`` naming the file (as given) and the line."""
    first: tuple[int, LoggedBatch] | None = None
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.endswith(b"\n"):
                raise DataError(f"{path} line {n}: the last line is cut short (no line end): torn by a crash "
                                "mid-write; delete that line (its batch is then missing: give the checkpoint before "
                                "it, or build the ledger by replay)")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{path} line {n}: not UTF-8 text: a binary file or a damaged line, not a batch "
                                "audit log; give the files ZEPHON_BATCH_LOG named") from None
            if not line.strip():
                continue
            batch = _parsed(line)
            if batch is None:
                batch = parse_line(line, f"{path} line {n}")
            if first is None:
                first = (n, batch)
            elif batch.run != first[1].run:
                raise DataError(f"{path} line {n}: {_whose(batch)}, line {first[0]} {_whose(first[1])}: one file "
                                "holds lines of two runs (or of two formats); give each run's logs in files of its own")
            yield n, batch


def _whose(b: LoggedBatch) -> str:
    return f"of run {b.run}" if b.run else "without a run (an earlier format)"


def read_batch_log(path: str | os.PathLike[str]) -> Iterator[LoggedBatch]:
    """The batches of one audit log file, in the order the rank trained on them (``numbered_lines``' checks)."""
    for _, batch in numbered_lines(path):
        yield batch
