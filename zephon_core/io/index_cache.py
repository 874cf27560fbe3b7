"""A safe on-disk cache for per-file document indexes.

An index is a few NumPy arrays. It is stored as an ``.npz`` written
atomically and loaded with ``allow_pickle=False``, together with the
fingerprint of the file it describes; a cache whose fingerprint differs from
the file's current one is ignored and rebuilt, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import IO, Any

import numpy as np

from zephon_core.io.atomic import write_atomically


def cache_root(cache_dir: str | os.PathLike[str] | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("ZEPHON_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "zephon" / "index"


def cache_path(root: Path, url: str, variant: str) -> Path:
    digest = hashlib.blake2b(f"{url}\x1f{variant}".encode(), digest_size=16).hexdigest()
    return root / f"{digest}.npz"


def load(path: Path, fingerprint: dict[str, Any]) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None when missing, unreadable or stale."""
    try:
        with np.load(path, allow_pickle=False) as data:
            stored = json.loads(bytes(data["fingerprint"]).decode())
            if stored != fingerprint:
                return None
            return {k: data[k] for k in data.files if k != "fingerprint"}
    except Exception:  # any damage (bad zip, CRC, truncation, object arrays): rebuild, never trust
        return None


def store(path: Path, fingerprint: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Write atomically; a failure to cache is not an error (the index is rebuilt next time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fp = np.frombuffer(json.dumps(fingerprint, sort_keys=True).encode(), dtype=np.uint8)

        def write(f: IO[bytes]) -> None:
            np.savez(f, fingerprint=fp, **arrays)  # type: ignore[arg-type]  # numpy's stub: **kwds typed as its flag

        write_atomically(path, write)
    except OSError:
        pass
