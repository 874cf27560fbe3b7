"""The loaders under test, one module per loader, behind one protocol.

A loader module (``bench/loaders/<module>.py``, listed in ``MODULES``) holds ``LOADERS``: a tuple of
``Loader``, one per variant a case can name (``{"loader": "zephon_core_npy", ...}`` in its JSON
arguments). A ``Loader`` says

* ``name``: what the case's ``loader`` argument calls it;
* ``venv``: which interpreter holds it, ``project`` (this checkout's venv) or ``peers`` (bench/run.sh's
  venv of peer loaders, where zephon_core is not importable);
* ``imports``: the modules imported before the case takes its baseline RSS (so that the libraries'
  own memory is not counted as the loader's);
* ``make(a)``: a fresh loader over the case's corpus (``a``: the case's arguments: paths, seed,
  seq_len, batch, options); iterating it yields batches of ``[batch, seq_len]`` inputs and labels;
* ``tokens_of(batch)``: the input tokens of one batch, after checking its shape;
* ``close(loader, iterator)``: releases threads and worker processes;
* ``resume``: for loaders that checkpoint (P3), how to save a state, restore a fresh loader from it
  and size it.

Every loader reads the same corpus (bench/corpus.py) with the same ``tokenizers`` BPE, appends EOS
(id 1) to each document, concatenates and splits into rows of ``seq_len + 1`` tokens. Loader modules
import their libraries inside functions: the driver imports them only to read ``name`` and ``venv``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MODULES = ("zephon_core", "zephon020", "torchdata", "grain", "floors")


def close_any(loader: Any, it: Any) -> None:
    """The default ``close``: the loader's (or else the iterator's) ``close`` or ``shutdown``."""
    for obj in (loader, it):
        for name in ("close", "shutdown"):
            fn = getattr(obj, name, None)
            if callable(fn):
                fn()
                return


@dataclass(frozen=True)
class Resume:
    """How a loader checkpoints (P3): ``save(loader, iterator) -> state`` (as read back from a file),
    ``restore_first(fresh loader, state) -> (first batch, iterator)``, ``size(state) -> bytes``."""

    save: Callable[[Any, Any], Any]
    restore_first: Callable[[Any, Any], tuple[Any, Any]]
    size: Callable[[Any], int]


@dataclass(frozen=True)
class Loader:
    name: str
    venv: str
    make: Callable[[dict], Any]
    tokens_of: Callable[[Any], int]
    imports: tuple[str, ...] = ("numpy", "tokenizers")
    close: Callable[[Any, Any], None] = close_any
    resume: Resume | None = None

    def import_libraries(self) -> None:
        for name in self.imports:
            importlib.import_module(name)


def all_loaders() -> dict[str, Loader]:
    out: dict[str, Loader] = {}
    for module in MODULES:
        for loader in importlib.import_module(f"loaders.{module}").LOADERS:
            assert loader.name not in out, f"two loaders are named {loader.name}"
            out[loader.name] = loader
    return out


def get(name: str) -> Loader:
    loaders = all_loaders()
    if name not in loaders:
        raise SystemExit(f"unknown loader {name} (bench/loaders: {', '.join(sorted(loaders))})")
    return loaders[name]
