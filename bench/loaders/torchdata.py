"""torchdata's StatefulDataLoader (project venv, where torch already is) over a stateful IterableDataset
that tokenizes one document at a time and keeps a token buffer, as TorchTitan's HF loader does."""

from __future__ import annotations

import copy
import pickle
from typing import Any

from loaders import Loader, Resume
from loaders.common import EOS, JsonlDocs, dict_tokens, doc_order, load_tokenizer


def loader(a: dict) -> Any:
    import numpy as np
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
    from torchdata.stateful_dataloader import StatefulDataLoader

    L = a["seq_len"] + 1

    class TokPack(IterableDataset):
        """Tokenize + concat-split packing, stateful: (epoch, documents consumed, token buffer)."""

        def __init__(self) -> None:
            self.docs = JsonlDocs(a["jsonl"])
            self.tok = load_tokenizer(a["tokenizer"])
            self._resume: dict | None = None
            self._state: dict = {"epoch": 0, "pos": 0, "buf": []}

        def state_dict(self) -> dict:
            return {"epoch": self._state["epoch"], "pos": self._state["pos"], "buf": list(self._state["buf"])}

        def load_state_dict(self, sd: dict) -> None:
            self._resume = sd

        def __iter__(self):
            wi = get_worker_info()
            W, wid = (wi.num_workers, wi.id) if wi else (1, 0)
            st = self._resume or {"epoch": 0, "pos": 0, "buf": []}
            self._resume = None
            epoch, pos, buf = st["epoch"], st["pos"], list(st["buf"])
            while True:
                mine = doc_order(len(self.docs), a["seed"], epoch)[wid::W]
                while pos < len(mine):
                    buf.extend(self.tok.encode(self.docs.text(int(mine[pos])), add_special_tokens=False).ids)
                    buf.append(EOS)
                    pos += 1
                    while len(buf) >= L:
                        row = np.asarray(buf[:L], dtype=np.int64)
                        del buf[:L]
                        self._state = {"epoch": epoch, "pos": pos, "buf": buf}
                        yield row
                epoch, pos = epoch + 1, 0

    def collate(rows: list) -> dict:
        x = torch.from_numpy(np.stack(rows))
        return {"input_ids": x[:, :-1], "labels": x[:, 1:]}

    nw = a["num_workers"]
    kw: dict[str, Any] = {"persistent_workers": False, "multiprocessing_context": "fork"} if nw else {}
    return StatefulDataLoader(TokPack(), batch_size=a["batch"], num_workers=nw, collate_fn=collate, **kw)


def close(dl: Any, it: Any) -> None:
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()


def _restore_first(dl: Any, st: Any) -> tuple[Any, Any]:
    dl.load_state_dict(copy.deepcopy(st))
    it = iter(dl)
    return next(it), it


RESUME = Resume(save=lambda dl, it: copy.deepcopy(dl.state_dict()), restore_first=_restore_first,
                size=lambda st: len(pickle.dumps(st)))

LOADERS = (
    Loader("torchdata", "project", loader, dict_tokens,
           ("numpy", "tokenizers", "torch", "torchdata.stateful_dataloader"), close, RESUME),
)
