"""What the loaders share: EOS, the JSONL reader of the peers, the epoch order, the tokenizer."""

from __future__ import annotations

import json
import os
from typing import Any

EOS = 1


class JsonlDocs:
    """Random access to the ``text`` of each line of a JSONL file (byte-offset index)."""

    def __init__(self, path: str) -> None:
        import numpy as np

        data = np.fromfile(path, dtype=np.uint8)
        ends = np.flatnonzero(data == 10)
        self.starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
        self.lengths = (ends - self.starts).astype(np.int64)
        self.path = path
        self._fd: int | None = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.starts)

    def text(self, i: int) -> str:
        if self._fd is None or self._pid != os.getpid():
            self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        return json.loads(os.pread(self._fd, int(self.lengths[i]), int(self.starts[i])))["text"]

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_fd"] = None
        return d


def doc_order(n: int, seed: int, epoch: int) -> Any:
    import numpy as np

    return np.random.default_rng([seed, epoch]).permutation(n)


def load_tokenizer(path: str) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def dict_tokens(b: dict) -> int:
    """``tokens_of`` for a batch that is a dict of ``input_ids`` (NumPy or torch) and labels."""
    x = b["input_ids"]
    assert tuple(x.shape) == (8, 512), x.shape
    return int(x.numel() if hasattr(x, "numel") else x.size)
