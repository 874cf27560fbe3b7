"""What the guide's examples share: the bundled corpus, three lanes of text; a steered run's training loop."""

from __future__ import annotations

import os
from collections import Counter
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


def steer(run, first, last, loss_sum, decisions):
    """Steps ``first..last`` of a ``MixingLoader`` over 8 lanes (8 batches a step), each recording the step's
    per-source losses, ``loss_sum(name, tokens, step)`` (a stand-in for the model's), and deciding when due:
    what each step trained on, as batch digests; the decisions made are appended to ``decisions``."""
    from zephon_core.pipeline.mixing import LocalFigures

    digests = []
    for step in range(first, last + 1):
        tokens = Counter()
        for _ in range(8):
            batch = next(run)
            digests.append(batch.digest)
            for _, source, _, start, stop in batch.segments.tolist():
                tokens[source] += stop - start
        counts = [tokens[s] for s in range(len(run.names))]
        run.record_loss([loss_sum(name, n, step) for n, name in zip(counts, run.names)], counts)
        if run.due(step):
            figures = LocalFigures.reduced([run.local_figures()])  # with G groups: all G groups' figures
            decision = run.decide(step, figures)
            if decision is not None:
                decisions.append(decision)
    return digests
