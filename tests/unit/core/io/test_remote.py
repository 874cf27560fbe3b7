"""The page pool behind object-store reads: exact bytes, one byte budget for all objects, scans bypass it."""

from __future__ import annotations

import random

import fsspec
import pytest

from zephon_core.io.remote import PAGE_BYTES, PagePool, RemoteBytes, iter_bytes


def _objects(tmp_path, sizes: list[int]) -> list[tuple[str, bytes]]:
    rng = random.Random(5)
    out = []
    for k, size in enumerate(sizes):
        data = rng.randbytes(size)
        path = tmp_path / f"obj{k}.bin"
        path.write_bytes(data)
        out.append((str(path), data))
    return out


def test_spans_read_through_a_small_pool_are_exact_and_the_pool_stays_within_its_budget(tmp_path):
    fs = fsspec.filesystem("file")
    pool = PagePool(3 * PAGE_BYTES)
    objects = _objects(tmp_path, [5 * PAGE_BYTES + 123, 3 * PAGE_BYTES - 7])
    readers = [RemoteBytes(fs, path, len(data), pool=pool) for path, data in objects]
    rng = random.Random(11)
    for _ in range(200):
        k = rng.randrange(len(objects))
        data = objects[k][1]
        spans = []
        for _ in range(rng.randrange(1, 5)):
            start = rng.randrange(len(data))
            spans.append((start, rng.randrange(0, min(len(data) - start, PAGE_BYTES + 999) + 1)))
        assert readers[k].read_many(spans) == [data[a : a + n] for a, n in spans]
        assert pool._held <= pool.budget_bytes or len(pool._pages) == 1


def test_consecutive_missing_pages_cost_one_request_and_cached_pages_none(tmp_path):
    fs = fsspec.filesystem("file")
    ((path, data),) = _objects(tmp_path, [4 * PAGE_BYTES])
    reader = RemoteBytes(fs, path, len(data), pool=PagePool(8 * PAGE_BYTES))
    assert reader.read_many([(10, 5), (PAGE_BYTES + 3, 2 * PAGE_BYTES)]) == [data[10:15], data[PAGE_BYTES + 3 : 3 * PAGE_BYTES + 3]]
    assert reader.requests == 1  # pages 0-3: one run
    reader.read_many([(2 * PAGE_BYTES, 100)])
    assert reader.requests == 1


def test_a_scan_leaves_the_pool_as_it_was(tmp_path):
    fs = fsspec.filesystem("file")
    ((path, data),) = _objects(tmp_path, [6 * PAGE_BYTES + 5])
    pool = PagePool(64 * PAGE_BYTES)
    reader = RemoteBytes(fs, path, len(data), pool=pool)
    assert b"".join(iter_bytes(reader, 2 * PAGE_BYTES)) == data
    assert pool._held == 0


@pytest.mark.parametrize("reuse", [False, True])
def test_objects_never_see_each_others_pages(tmp_path, reuse):
    fs = fsspec.filesystem("file")
    pool = PagePool(16 * PAGE_BYTES)
    (a_path, a), (b_path, b) = _objects(tmp_path, [2 * PAGE_BYTES, 2 * PAGE_BYTES])
    first = RemoteBytes(fs, a_path, len(a), pool=pool)
    assert first.read_many([(0, 100)]) == [a[:100]]
    if reuse:
        del first  # a new object may get the old one's id(); it must still not get its pages
    second = RemoteBytes(fs, b_path, len(b), pool=pool)
    assert second.read_many([(0, 100)]) == [b[:100]]
