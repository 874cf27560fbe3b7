"""The work source the guide's examples share: the bundled corpus, three lanes of text."""

from __future__ import annotations

import os
from pathlib import Path

from tokenizers import Tokenizer

from zephon_core import JsonlSource, Pipeline, StaticMixture

CORPUS = Path(__file__).resolve().parents[2] / "configs" / "corpus"


def work_source() -> StaticMixture:
    return StaticMixture([JsonlSource(str(CORPUS / "stdlib_docs.jsonl"))], seed=1234, chunk_size=16)


def with_operators(pipeline: Pipeline) -> Pipeline:
    """The operators every example uses: tokenize, pack to 128 tokens, shuffle, batch."""
    tokenizer = Tokenizer.from_file(str(CORPUS / "tokenizer.json"))
    return pipeline.tokenize(tokenizer, bos_id=0, eos_id=1).pack(seq_len=128).shuffle(window=8).batch(2)


def aggregate_dir() -> str:
    """Where the examples' pipelines meet to checkpoint (a shared folder or s3:// prefix)."""
    return os.environ.get("ZEPHON_EXAMPLE_AGGREGATE_DIR", "/tmp/zephon-guide-aggregate")
