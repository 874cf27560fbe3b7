"""The committed lanes of a slot as one int64 table, summed across replica groups once per step.

Row 0 is a header: ``(1, step, batches_per_lane, fingerprint words...)``; row ``1 + i`` is lane
``slot_lanes[i]``: ``(1, cursor x 4, delivered, tally counts, stage rows, tokens..., documents...)``.
Each participant fills the header and the rows of the lanes it delivered and leaves zeros
elsewhere, so a SUM over the participants holds every lane exactly once, and a header of ``P``
times one value proves that all ``P`` agree on the step and the data definition. Everything is
a fixed-width integer: no pickle, nothing to parse but numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from zephon_core.batch import Cursor
from zephon_core.checkpoint.state import LaneState
from zephon_core.errors import StateError
from zephon_core.metrics import Tally

_FP_WORDS = 3  # 28-bit words of the fingerprint: a sum over thousands of replicas stays far inside int64
_COUNTS = 12  # present, cursor x 4, delivered, since, rows, padding, cut, truncated, stage rows


class TableCodec:
    """Encodes and checks the table of one slot's lanes for a data definition of ``stages x sources`` tallies."""

    def __init__(self, slot_lanes: list[int], stages: int, sources: int, fingerprint: str,
                 batches_per_lane: int) -> None:
        self.slot_lanes = list(slot_lanes)
        self._row = {lane: 1 + i for i, lane in enumerate(self.slot_lanes)}
        self._stages, self._sources = stages, sources
        self._fp = [int(fingerprint[7 * w : 7 * (w + 1)], 16) for w in range(_FP_WORDS)]
        self._k = batches_per_lane
        self.width = _COUNTS + 2 * stages * sources

    @property
    def nbytes(self) -> int:
        """Bytes of one table: what each replica sends per step."""
        return 8 * (1 + len(self.slot_lanes)) * self.width

    def header(self, step: int) -> np.ndarray:
        return np.array([1, step, self._k, *self._fp], dtype=np.int64)

    def encode(self, step: int, lanes: Mapping[int, LaneState]) -> np.ndarray:
        """This participant's contribution: the header and the rows of ``lanes`` (after the step), zeros elsewhere."""
        table = np.zeros((1 + len(self.slot_lanes), self.width), dtype=np.int64)
        head = self.header(step)
        table[0, : len(head)] = head
        if lanes:
            rows = [self._row[lane] for lane in lanes]
            table[rows] = np.array([self._encode_lane(st) for st in lanes.values()], dtype=np.int64)
        return table

    def _encode_lane(self, st: LaneState) -> list[int]:
        t = st.tally or Tally(since=st.delivered)
        n, m = self._stages, self._sources
        if len(t.tokens) > n or any(len(r) > m for r in t.tokens):
            raise StateError(f"live mode: a lane's tally has {len(t.tokens)} stages, more than the definition's {n}")
        tables = [0] * (2 * n * m)
        for i, (tok, doc) in enumerate(zip(t.tokens, t.documents)):
            tables[i * m : i * m + len(tok)] = tok
            tables[(n + i) * m : (n + i) * m + len(doc)] = doc
        return [1, *st.cursor, st.delivered, t.since, t.rows, t.padding, t.cut, t.truncated, len(t.tokens), *tables]

    def problems(self, summed: np.ndarray, participants: int, step: int) -> list[str]:
        """Why a summed table cannot be committed at ``step`` with ``participants`` contributing (empty: it can)."""
        P = participants
        if summed.shape != (1 + len(self.slot_lanes), self.width):
            mine = (1 + len(self.slot_lanes), self.width)
            return [f"live table: shape {summed.shape} differs from this replica's {mine}"]
        head = summed[0, : 3 + _FP_WORDS]
        if int(head[0]) != P:
            return [f"live table: {int(head[0])} replica groups contributed, num_participants() says {P}"]
        out = []
        if [int(v) for v in head[3:]] != [P * w for w in self._fp]:
            out.append("live table: the replica groups disagree on the data definition (fingerprint): every replica "
                       "group must build the same recipe, tokenizer, seq_len and batch size")
        if int(head[1]) != P * step or int(head[2]) != P * self._k:
            out.append(f"live table: the replica groups disagree on the committed step or batches per lane (sums "
                       f"{int(head[1])}, {int(head[2])} over {P}; this replica: step {step}, {self._k} per lane): "
                       "a replica group restored another checkpoint or was not healed")
        present = summed[1:, 0]
        wrong = [lane for lane, n in zip(self.slot_lanes, present.tolist()) if n != 1]
        if wrong:
            times = sorted(set(present.tolist()) - {1})
            out.append(f"live table: lane(s) {wrong[:8]} were delivered {times} times in the step, not once: the "
                       "replica groups disagree on the participants")
        return out

    def late(self, summed: np.ndarray, delivered: int) -> list[int]:
        """The lanes of a summed table that have not delivered ``delivered`` batches (one vectorised pass)."""
        return [self.slot_lanes[i] for i in np.flatnonzero(summed[1:, 5] != delivered).tolist()]

    def moved(self, summed: np.ndarray, sent: np.ndarray, lanes: Sequence[int]) -> list[int]:
        """The ``lanes`` whose position in ``summed`` differs from what this replica ``sent``."""
        rows = [self._row[lane] for lane in lanes]
        return [lanes[i] for i in np.flatnonzero((summed[rows, 1:6] != sent[rows, 1:6]).any(axis=1)).tolist()]

    def decode(self, summed: np.ndarray, lanes: Sequence[int] | None = None) -> dict[int, LaneState]:
        """``lanes`` (default: every lane of the slot) from a table that passed ``problems``, in one pass over their
        rows: a replica decodes the lanes it takes over at a step, and all of them only to checkpoint."""
        n, m = self._stages, self._sources
        lanes = self.slot_lanes if lanes is None else list(lanes)
        body = summed[[self._row[lane] for lane in lanes]]
        heads = body[:, :_COUNTS].tolist()
        tokens = body[:, _COUNTS : _COUNTS + n * m].reshape(-1, n, m).tolist()
        documents = body[:, _COUNTS + n * m :].reshape(-1, n, m).tolist()
        out = {}
        for lane, h, tok, doc in zip(lanes, heads, tokens, documents):
            tally = Tally(h[6], h[7], h[8], h[9], tok[: h[11]], doc[: h[11]], h[10])
            out[lane] = LaneState(Cursor(h[1], h[2], h[3], h[4]), h[5], tally)
        return out
