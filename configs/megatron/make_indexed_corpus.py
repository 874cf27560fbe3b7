"""Write a Megatron indexed dataset (.bin/.idx) from a JSON-lines corpus.

    python configs/megatron/make_indexed_corpus.py \
        [--input configs/corpus/stdlib_docs.jsonl] [--tokenizer configs/corpus/tokenizer.json] \
        [--eod-id 1] [--out configs/megatron/data/stdlib_docs_text_document]

Like Megatron-LM's tools/preprocess_data.py with --append-eod: one document per
line, tokenized with a `tokenizers` tokenizer, the EOD id appended, written
with megatron-core's own IndexedDatasetBuilder (uint16 when the vocabulary fits).
configs/data/mg_indexed.toml reads the default output.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "corpus"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", default=str(CORPUS / "stdlib_docs.jsonl"))
    ap.add_argument("--text-field", default="text")
    ap.add_argument("--tokenizer", default=str(CORPUS / "tokenizer.json"))
    ap.add_argument("--eod-id", type=int, default=1, help="appended to every document (<|end_of_text|> in the bundled tokenizer)")
    ap.add_argument("--out", default=str(HERE / "data" / "stdlib_docs_text_document"), help="output prefix (no extension)")
    a = ap.parse_args(argv)

    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(a.tokenizer)
    dtype = np.uint16 if tok.get_vocab_size() < 65500 else np.int32
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    builder = IndexedDatasetBuilder(a.out + ".bin", dtype=dtype)
    docs = tokens = 0
    with open(a.input, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            ids = tok.encode(json.loads(line)[a.text_field], add_special_tokens=False).ids + [a.eod_id]
            builder.add_document(np.asarray(ids, dtype=np.int64), [len(ids)])
            docs += 1
            tokens += len(ids)
    builder.finalize(a.out + ".idx")
    print(f"{a.out}.bin/.idx: {docs} documents, {tokens} tokens ({np.dtype(dtype).name})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
