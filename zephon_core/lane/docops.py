"""Running per-document operators over a chunk, in parallel, in input order.

Each operator with ``parallelism > 1`` gets its own pool of threads or
processes. A chunk's documents are cut into contiguous slices, one task per
slice, and the results are joined in slice order, so the output never depends
on which worker finished first.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import numpy as np

from zephon_core.errors import DataError
from zephon_core.lane.ops import DocOp, FilterOp, MapOp, TokenizeOp, callable_identity


class _Dropped:
    """The slot of a document a filter removed: it stays, so document numbers in cursors do not move.

    Pickled by name, so a process pool hands back this very object.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "DROPPED"

    def __reduce__(self) -> str:
        return "DROPPED"


DROPPED = _Dropped()


def _encode(tok: Any, texts: list[str]) -> list[list[int]]:
    # A tokenizers.Tokenizer: encode_batch_fast (tokenizers >= 0.20) gives the same ids
    # without computing character offsets, which nothing here uses.
    encode_batch = getattr(tok, "encode_batch_fast", None) or getattr(tok, "encode_batch", None)
    if encode_batch is not None and hasattr(tok, "to_str"):
        return [e.ids for e in encode_batch(texts, add_special_tokens=False)]
    encode = getattr(tok, "encode", None)
    fn = encode if callable(encode) else tok
    return [list(fn(t)) for t in texts]  # lists (the tokenizers path already returns lists)


def run_op_on_slice(op: DocOp, docs: list[Any]) -> list[Any]:
    """Apply one operator to a slice of documents (module level: picklable for processes)."""
    if isinstance(op, MapOp):
        mapped = [DROPPED if d is DROPPED else op.fn(d) for d in docs]
        if any(d is None for d in mapped):
            raise DataError(
                f"map: {callable_identity(op.fn)} returned None for a document; return the transformed document, "
                "or remove documents with .filter(...)"
            )
        return mapped
    if isinstance(op, FilterOp):
        return [DROPPED if d is DROPPED or not op.fn(d) else d for d in docs]
    if isinstance(op, TokenizeOp):
        live = [j for j, d in enumerate(docs) if d is not DROPPED]
        texts = []
        for j in live:
            if not isinstance(docs[j], str):
                raise DataError(f"tokenize: expected text, got {type(docs[j]).__name__} (is the source already tokenized?)")
            texts.append(docs[j])
        out: list[Any] = [DROPPED] * len(docs)
        prefix = [op.bos_id] if op.bos_id is not None else []
        suffix = [op.eos_id] if op.eos_id is not None else []
        for j, ids in zip(live, _encode(op.tokenizer, texts)):
            out[j] = np.array(prefix + ids + suffix if prefix or suffix else ids, dtype=np.int64)
        return out
    raise TypeError(op)


def token_counter(tokenizer: Any, *, bos_id: int | None = None, eos_id: int | None = None) -> Callable[[Sequence[Any]], list[int]]:
    """How many tokens documents become through ``Pipeline.tokenize(tokenizer, bos_id=, eos_id=)``.

    For ``StagedMixture(token_counter=...)``: token weights and token
    boundaries over text sources estimate document lengths with it.
    """
    op = TokenizeOp(tokenizer=tokenizer, bos_id=bos_id, eos_id=eos_id)

    def count(docs: Sequence[Any]) -> list[int]:
        return [len(ids) for ids in run_op_on_slice(op, list(docs))]

    return count


class DocOpRunner:
    """Owns the pools of a pipeline's per-document operators."""

    def __init__(self, ops: Sequence[DocOp]) -> None:
        self.ops = list(ops)
        self._pools: list[Executor | None] = []
        for op in self.ops:
            if op.parallelism == 1 and op.runner == "thread":
                self._pools.append(None)
            elif op.runner == "process":
                ctx = multiprocessing.get_context("forkserver")
                self._pools.append(ProcessPoolExecutor(op.parallelism, mp_context=ctx))
            else:
                self._pools.append(ThreadPoolExecutor(op.parallelism, thread_name_prefix=f"zephon-{op.kind}"))

    def run(self, docs: list[Any]) -> list[Any]:
        for op, pool in zip(self.ops, self._pools):
            if pool is None or len(docs) < 2:
                docs = run_op_on_slice(op, docs)
                continue
            n = min(op.parallelism, len(docs))
            bounds = np.linspace(0, len(docs), n + 1).astype(int)
            futures = [pool.submit(run_op_on_slice, op, docs[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
            docs = [d for f in futures for d in f.result()]
        return docs

    def close(self) -> None:
        for pool in self._pools:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
