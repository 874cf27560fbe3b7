"""How often one call moves between the project's files ("stays", issue #33): a measure of how much an adapter's
start-up goes back and forth between itself and the core instead of asking the core once.

    python tests/support/stays.py            # Megatron's prepare(args) on a small run: stays, files, returns
    python tests/support/stays.py --all      # counting every file of zephon_core, not only the adapters' door

A *stay* is a run of consecutive Python frames (calls and the returns into their callers, ``sys.setprofile``)
in one counted file; a *return* is a stay in a file the call had already left once. Files outside the counted
set (the standard library, third-party packages and, without ``--all``, the core behind
``zephon_core.integration``) are not rooms of their own: time spent there counts towards the room that called
them. ``tests/unit/megatron/test_megatron_prepare_stays.py`` holds the count under a bound.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = (ROOT / "integrations",)
DOOR = (ROOT / "zephon_core" / "integration",)


class Stays(NamedTuple):
    rooms: tuple[str, ...]  # the counted file of each stay, in order (relative to the repository)

    @property
    def stays(self) -> int:
        return len(self.rooms)

    @property
    def files(self) -> int:
        return len(set(self.rooms))

    @property
    def returns(self) -> int:
        return self.stays - self.files


def trace_stays(call: Callable[[], Any], *, counted: tuple[Path, ...] = ADAPTERS + DOOR) -> Stays:
    """Run ``call`` once and record the counted file it is in at every call and return."""
    roots = tuple(str(p) for p in counted)
    rooms: list[str] = []

    def room_of(frame: Any) -> None:
        name = frame.f_code.co_filename if frame is not None else ""
        if name.startswith(roots) and (not rooms or rooms[-1] != name):
            rooms.append(name)

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call":
            room_of(frame)
        elif event == "return":
            room_of(frame.f_back)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return Stays(tuple(str(Path(r).relative_to(ROOT)) for r in rooms))


def megatron_args(folder: Path) -> Namespace:
    """A small Megatron run selecting Zephon: dp 2, one held-out recipe, a constant global batch."""
    (folder / "train.toml").write_text('canonical_replicas = 4\n[[sources]]\npath = "x.jsonl"\n')
    (folder / "held.toml").write_text('exhausted = "stop"\n[[sources]]\npath = "x.jsonl"\n')
    return Namespace(dataloader_type="zephon", zephon_recipe=str(folder / "train.toml"),
                     zephon_valid_recipe=[str(folder / "held.toml")], data_parallel_size=2, micro_batch_size=2,
                     global_batch_size=8, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                     context_parallel_size=1, eval_iters=2, eval_interval=10, create_attention_mask_in_dataloader=False,
                     zephon_aggregate_dir=str(folder), zephon_run_id="r", seq_length=32, train_iters=20,
                     step_batch_size_schedule=None, rampup_batch_size=None, full_validation=False)


def prepare_stays(folder: Path, *, every_core_file: bool = False) -> Stays:
    """The stays of one ``zephon_megatron.loader.prepare(args)`` (imports done first: they are not start-up)."""
    from zephon_megatron import loader

    args = megatron_args(folder)
    counted = ADAPTERS + ((ROOT / "zephon_core",) if every_core_file else DOOR)
    return trace_stays(lambda: loader.prepare(args), counted=counted)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--all", action="store_true", help="count every file of zephon_core, not only the door")
    p.add_argument("--rooms", action="store_true", help="print the file of every stay")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        s = prepare_stays(Path(tmp), every_core_file=a.all)
    if a.rooms:
        print("\n".join(s.rooms))
    print(f"prepare(args): {s.stays} stays in {s.files} files, {s.returns} returns")


if __name__ == "__main__":
    main()
