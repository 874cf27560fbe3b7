"""What the document-mask tests of both frameworks share (tests/unit/torchtitan/test_torchtitan_document_masks.py,
tests/unit/megatron/test_megatron_document_masks.py).

A corpus of short token documents, the same corpus with one document's tokens all replaced (same length, so
every packing mode lays the rows out identically), the document each packed token came from (from a batch's
provenance), and the two checks on per-token losses ``[B, L]``: *isolated* (a token whose input and label lie
outside the altered document keeps its loss exactly; the altered document's own losses move) and *leaks* (the
control: without document masking some untouched token's loss moves).
"""

from __future__ import annotations

import numpy as np
import torch

from zephon_core import Batch

#: Token ids stay below this (the smaller of the two test models' vocabularies); 0 is Zephon's padding id.
VOCAB = 256
#: A change below this is numerical noise; the checks want the altered losses to move by far more.
MOVED = 1e-3


def corpus(n: int = 96, seed: int = 0, lengths: tuple[int, int] = (5, 19)) -> list[np.ndarray]:
    """``n`` documents of ``lengths[0]`` to ``lengths[1] - 1`` tokens, ids in ``[1, VOCAB)``."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, VOCAB, int(k)).astype(np.int64) for k in rng.integers(*lengths, n)]


def altered(docs: list[np.ndarray], d: int) -> list[np.ndarray]:
    """``docs`` with every token of document ``d`` replaced by another id (same length)."""
    out = list(docs)
    out[d] = (docs[d] - 1 + 37) % (VOCAB - 1) + 1  # a shift by 37 within [1, VOCAB): no token keeps its id
    assert (out[d] != docs[d]).all()
    return out


def owners(batch: Batch) -> np.ndarray:
    """``[B, L + 1]``: the document number of each packed token of the batch's rows, -1 on padding."""
    B, L = batch.input_ids.shape
    out = np.full((B, L + 1), -1, dtype=np.int64)
    for r, row in enumerate(batch.provenance):
        at = 0
        for s in row:
            out[r, at : at + s.stop - s.start] = s.document
            at += s.stop - s.start
    return out


def documents_per_row(owner: np.ndarray) -> list[int]:
    return [len(set(row[row >= 0].tolist())) for row in owner]


def pick_document(owner: np.ndarray) -> int:
    """A document that continues from one row into the next (concat packing), else row 0's first document:
    either way one with other documents after it in a row, whose losses a leak would move."""
    rows = [set(row[row >= 0].tolist()) for row in owner]
    for a, b in zip(rows, rows[1:]):
        if a & b:
            return min(a & b)
    return int(owner[0, 0])


def _positions(owner: np.ndarray, doc: int) -> tuple[np.ndarray, np.ndarray]:
    """Boolean ``[B, L]``: tokens whose input and label both lie outside ``doc`` (padding excluded), and inside it."""
    inputs, labels = owner[:, :-1], owner[:, 1:]
    untouched = (inputs >= 0) & (labels >= 0) & (inputs != doc) & (labels != doc)
    inside = (inputs == doc) & (labels == doc)
    return untouched, inside


def check_isolated(base: torch.Tensor, other: torch.Tensor, owner: np.ndarray, doc: int) -> None:
    """Losses of the untouched tokens are unchanged (to ``1e-6``; on CPU they are bitwise equal), those inside
    ``doc`` move."""
    untouched, inside = _positions(owner, doc)
    assert untouched.any() and inside.any()
    u, i = torch.from_numpy(untouched), torch.from_numpy(inside)
    torch.testing.assert_close(other[u], base[u], rtol=0, atol=1e-6)
    assert (other[i] - base[i]).abs().max() > MOVED, "altering the document did not change its own losses"


def check_leaks(base: torch.Tensor, other: torch.Tensor, owner: np.ndarray, doc: int) -> None:
    """The control: some untouched token's loss moves when ``doc`` is altered (attention crosses documents)."""
    untouched, _ = _positions(owner, doc)
    u = torch.from_numpy(untouched)
    assert (other[u] - base[u]).abs().max() > MOVED, "untouched losses did not move without document masks"
