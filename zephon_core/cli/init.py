"""``zephon init``: write the bundled configs into a folder, for installs without the clone.

After ``zephon init`` in a folder, every command the docs show with
``configs/...`` paths runs from that folder as it does from the repository root.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from zephon_core.errors import ConfigError
from zephon_core.integration import bundled_configs

#: What ``init`` writes: the package data of the wheel (setup.py's CONFIG_FILES), nothing generated; the corpus
#: with its subfolders (``corpus/curriculum/`` feeds the curriculum recipes).
PATTERNS = ("corpus/**/*", "data/*.toml", "megatron/*.sh", "megatron/*.py", "torchtitan/*.toml")


def bundled_files() -> list[Path]:
    """The bundled files, relative to the configs folder."""
    src = bundled_configs()
    return sorted({p.relative_to(src) for pattern in PATTERNS for p in src.glob(pattern) if p.is_file()})


def write_configs(folder: str, force: bool = False) -> list[Path]:
    """Copy the bundled configs to ``folder/configs``; refuses to overwrite unless ``force``."""
    src, dest = bundled_configs(), Path(folder) / "configs"
    if src.resolve() == dest.resolve():
        raise ConfigError(f"{dest}: these are the bundled configs themselves; run zephon init in another folder")
    files = bundled_files()
    existing = [str(dest / f) for f in files if (dest / f).exists()]
    if existing and not force:
        raise ConfigError(f"{existing[0]} exists ({len(existing)} file(s) would be overwritten); pass --force to overwrite them")
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / f, dest / f)
    return [dest / f for f in files]


def cmd_init(a: argparse.Namespace) -> int:
    written = write_configs(a.folder, a.force)
    root = Path(a.folder) / "configs"
    print(f"wrote {len(written)} files to {root}: data recipes (data/), the demo corpus and tokenizer (corpus/), "
          "the TorchTitan 0.2 job file (torchtitan/) and the Megatron launch scripts (megatron/)")
    print(f"from {Path(a.folder)}, try: zephon explain configs/data/demo.toml")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("init", help="write the bundled configs (recipes, demo corpus, job files) into a folder")
    p.add_argument("folder", nargs="?", default=".", help="where configs/ goes (default: here)")
    p.add_argument("--force", action="store_true", help="overwrite files that are already there")
    p.set_defaults(fn=cmd_init)
