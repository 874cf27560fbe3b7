"""Writes the small corpora of every format that test_golden_fingerprints.py pins (run once; the files are committed,
so their bytes never depend on the versions of the libraries that wrote them).

    python tests/unit/core/sources/golden/make_fixtures.py
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path
from unittest import mock

import numpy as np

HERE = Path(__file__).resolve().parent
TEXTS = [f"doc {j}: " + "the quick brown fox jumps over the lazy dog"[: 5 + 3 * j] for j in range(12)]
TOKENS = [list(range(3 + j, 3 + 2 * j + 2)) for j in range(12)]


def main() -> None:
    halves = [TEXTS[:5], TEXTS[5:]]
    (HERE / "jsonl").mkdir(exist_ok=True)
    (HERE / "jsonl" / "part-0.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in halves[0]))
    with gzip.GzipFile(HERE / "jsonl" / "part-1.jsonl.gz", "wb", mtime=0) as g:
        g.write("".join(json.dumps({"text": t}) + "\n" for t in halves[1]).encode())

    import pyarrow as pa
    import pyarrow.parquet as pq

    (HERE / "parquet").mkdir(exist_ok=True)
    for k, part in enumerate(halves):
        pq.write_table(pa.table({"text": part}), HERE / "parquet" / f"part-{k}.parquet", row_group_size=3)

    import datasets

    with mock.patch.object(datasets.config, "DEFAULT_MAX_BATCH_SIZE", 4):
        table = datasets.Dataset.from_dict({"text": TEXTS, "n": list(range(12))})
        table.save_to_disk(str(HERE / "arrow"), num_shards=2)

    (HERE / "webdataset").mkdir(exist_ok=True)
    for k, part in enumerate(halves):
        with tarfile.open(HERE / "webdataset" / f"part-{k}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for j, t in enumerate(part):
                for ext, body in (("txt", t.encode()), ("cls", str(j).encode())):
                    info = tarfile.TarInfo(f"s{k}/{j:04d}.{ext}")
                    info.size, info.mtime, info.uname, info.gname = len(body), 0, "", ""
                    tar.addfile(info, io.BytesIO(body))

    from streaming import MDSWriter

    with MDSWriter(out=str(HERE / "mds"), columns={"text": "str", "n": "int"}, size_limit=700) as w:
        for j, t in enumerate(TEXTS):
            w.write({"text": t, "n": j})
    with MDSWriter(out=str(HERE / "mds_tokens"), columns={"tokens": "ndarray:int32"}, size_limit=700) as w:
        for toks in TOKENS:
            w.write({"tokens": np.asarray(toks, dtype=np.int32)})

    (HERE / "token_array").mkdir(exist_ok=True)
    np.save(HERE / "token_array" / "tokens.npy", np.concatenate([np.asarray(t, dtype=np.int32) for t in TOKENS]))
    np.save(HERE / "token_array" / "offsets.npy", np.cumsum([0] + [len(t) for t in TOKENS]).astype(np.int64))

    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    (HERE / "megatron").mkdir(exist_ok=True)
    for k, part in enumerate([TOKENS[:5], TOKENS[5:]]):
        prefix = HERE / "megatron" / f"part-{k}_text_document"
        builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
        for toks in part:
            builder.add_document(torch.tensor(toks, dtype=torch.int32), [len(toks)])
        builder.finalize(f"{prefix}.idx")


if __name__ == "__main__":
    main()
