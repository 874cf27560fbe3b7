"""Documents named by the content hash the ledger prints (``verify.ledger.content_hash``), resolved to every
``(source name, document number)`` that holds that content.

A hash names content, not a place: a document copied into several sources, or several times into one, is
every copy, which is what a quarantine of a duplicated or contaminated document wants. Two ways to find
them: read every source once (``scan``: each document read and hashed once, in blocks, so the cost is one
pass over the corpus), or look them up in a ledger's Parquet file (``in_ledger``: no corpus read, but only
the documents that run trained on up to its checkpoint are there).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from zephon_core.errors import ConfigError
from zephon_core.verify.ledger import content_hash

HASH = re.compile(r"[0-9a-f]{16}")
BLOCK = 4096  # documents read at once: one read call per block keeps a remote source's requests few

Found = dict[str, list[tuple[str, int]]]


def is_content_hash(text: str) -> bool:
    """Whether ``text`` has the form of a content hash (16 lower-case hex digits, as the ledger prints them)."""
    return HASH.fullmatch(text) is not None


def scan_blocks(sources: Sequence[Any]) -> int:
    """The read calls ``scan`` makes over ``sources``, for a progress bar's total."""
    return sum(-(-len(src) // BLOCK) for src in sources)


def scan(sources: Sequence[Any], hashes: Collection[str],
         on_block: Callable[[str], None] | None = None) -> Found:
    """Every ``(source name, document)`` of ``sources`` whose content hash is one of ``hashes``, per hash (in source
    then document order; a hash nothing has is absent). ``on_block(label)`` is called after each block read."""
    wanted = set(hashes)
    found: Found = {}
    for src in sources:
        n = len(src)
        for start in range(0, n, BLOCK):
            stop = min(n, start + BLOCK)
            for d, doc in zip(range(start, stop), src.read(list(range(start, stop)))):
                h = content_hash(doc)
                if h in wanted:
                    found.setdefault(h, []).append((src.name, d))
            if on_block is not None:
                on_block(f"{src.name} {stop:,}/{n:,}")
    return found


def in_ledger(path: str, hashes: Collection[str]) -> Found:
    """Every ``(source name, document)`` of the ledger Parquet file at ``path`` (``zephon ledger --parquet``) whose
    hash is one of ``hashes``, per hash; only the columns ``source``, ``document`` and ``hash`` are read."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=["source", "document", "hash"])
    except (OSError, pa.ArrowInvalid, KeyError) as e:
        raise ConfigError(f"--ledger {path}: not a ledger Parquet file written by zephon ledger --parquet "
                          f"({e})") from None
    table = table.filter(pc.is_in(table["hash"].cast(pa.string()), value_set=pa.array(sorted(set(hashes)))))
    found: Found = {}
    rows = zip(table["hash"].cast(pa.string()).to_pylist(), table["source"].cast(pa.string()).to_pylist(),
               table["document"].to_pylist())
    for h, source, document in sorted(set(rows), key=lambda r: (r[0], r[1], r[2])):
        found.setdefault(h, []).append((source, int(document)))
    return found


def resolve(hashes: Sequence[str], found: Mapping[str, Sequence[tuple[str, int]]], where: str
            ) -> list[tuple[str, int]]:
    """The documents of every hash in ``hashes``; the first that ``found`` has none of is refused (ConfigError) naming
    it and ``where`` it was looked for."""
    out: list[tuple[str, int]] = []
    for h in hashes:
        if not found.get(h):
            raise ConfigError(f"--document {h}: no document has this content hash (looked in {where}); "
                              "copy the hash from zephon ledger's output, or name the document SOURCE#N")
        out += found[h]
    return out
