"""``zephon from-megatron``: a Zephon recipe from Megatron-LM's data flags, so that a team moving to
``--dataloader-type zephon`` keeps its ``.bin``/``.idx`` corpus where it is and its blend as it was.

Megatron's ``--data-path`` (or the file ``--data-args-path`` names) is either prefixes alone, every
document of each once, or weights and prefixes in turn. Megatron gives each dataset its weight's share
of the *samples*, sequences of ``--seq-length`` tokens, so weights become token shares here
(``weight_by = "tokens"``). The order of samples is Zephon's, not Megatron's: the same documents in
the same proportions, not the same batches.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zephon_core.errors import ConfigError

MEGATRON_SEED = 1234  # Megatron's --seed default


def parse_blend(words: Sequence[str], where: str) -> tuple[list[str], list[float] | None]:
    """Prefixes and weights (None: unweighted) of a Megatron blend list, read as megatron-core reads it: an even
    number of words whose every other word is a number is weight-prefix pairs; anything else is prefixes."""
    if not words:
        raise ConfigError(f"{where}: no data prefixes given; pass Megatron's list, "
                          "e.g. --data-path 0.7 PREFIX_A 0.3 PREFIX_B")
    pairs = len(words) % 2 == 0 and all(_number(w) is not None for w in words[::2])
    if not pairs:
        return list(words), None
    weights = [float(w) for w in words[::2]]
    prefixes = list(words[1::2])
    bad = [f"{w!r} (for {p})" for w, p in zip(words[::2], prefixes) if not float(w) > 0 or not math.isfinite(float(w))]
    if bad:
        raise ConfigError(f"{where}: blend weights must be positive numbers, got {', '.join(bad)}")
    return prefixes, weights


def _number(word: str) -> float | None:
    try:
        return float(word)
    except ValueError:
        return None


def _unsuffixed(prefix: str, where: str) -> str:
    for suffix in (".bin", ".idx"):
        if prefix.endswith(suffix):
            raise ConfigError(f"{where}: {prefix!r} names a file; a Megatron prefix has no suffix: "
                              f"{prefix[: -len(suffix)]!r}")
    return prefix


def recipe_text(prefixes: Sequence[str], weights: Sequence[float] | None, *, seed: int, command: str) -> str:
    """The recipe's TOML: one ``megatron`` source per weighted prefix, or one source of every prefix."""
    lines = [f"# Written by `{command}`.",
             "# Megatron's blend as Zephon sources: the same documents, read where they are;",
             "# the sample order is Zephon's.",
             f"seed = {seed}"]
    if weights is None:
        lines += ["", "[[sources]]", f"paths = {json.dumps(list(prefixes))}" if len(prefixes) > 1 else
                  f"path = {json.dumps(prefixes[0])}", 'format = "megatron"']
        return "\n".join(lines) + "\n"
    total = sum(weights)
    lines += ["# Megatron's weights are shares of samples (sequences of --seq-length tokens): token shares here.",
              'weight_by = "tokens"']
    for k, (prefix, weight) in enumerate(zip(prefixes, weights)):
        lines += ["", "[[sources]]", f"name = {json.dumps(f'blend{k}')}", f"path = {json.dumps(prefix)}",
                  'format = "megatron"', f"weight = {weight / total!r}"]
    return "\n".join(lines) + "\n"


def cmd_from_megatron(args: argparse.Namespace) -> int:
    if (args.data_path is None) == (args.data_args_path is None):
        raise ConfigError("zephon from-megatron: pass exactly one of --data-path and --data-args-path, as to Megatron")
    if args.data_path is not None:
        words, where = args.data_path, "--data-path"
    else:
        try:
            words, where = Path(args.data_args_path).read_text().split(), args.data_args_path
        except OSError as e:
            raise ConfigError(f"{args.data_args_path}: cannot read it ({e.strerror}); "
                              "--data-args-path names a file") from None
    prefixes, weights = parse_blend(words, where)
    prefixes = [_unsuffixed(p, where) for p in prefixes]
    flag = f"--data-path {' '.join(words)}" if args.data_path is not None else f"--data-args-path {args.data_args_path}"
    text = recipe_text(prefixes, weights, seed=args.seed, command=f"zephon from-megatron {flag}")
    if args.out:
        out = Path(args.out)
        if out.exists() and not args.force:
            raise ConfigError(f"{out}: already exists; pass --force to overwrite it")
        out.write_text(text)
        print(f"wrote {out}: {len(prefixes)} Megatron prefix(es)" + ("" if weights is None else " with their weights"))
    else:
        print(text, end="")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("from-megatron", help="write a recipe from Megatron-LM's --data-path / --data-args-path")
    p.add_argument("--data-path", nargs="+", metavar="WORD", help="Megatron's list: PREFIX ... or WEIGHT PREFIX ...")
    p.add_argument("--data-args-path", metavar="FILE", help="a file holding that list, as Megatron reads it")
    p.add_argument("--seed", type=int, default=MEGATRON_SEED,
                   help="the recipe's seed (default: Megatron's, %(default)s)")
    p.add_argument("--out", metavar="TOML", help="write the recipe there (default: print it)")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.set_defaults(fn=cmd_from_megatron)
