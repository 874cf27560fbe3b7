"""How the command line fails: one line naming what is wrong and the fix, exit status 1.

``--debug`` (or ``ZEPHON_DEBUG=1``) lets the traceback through instead. A
missing optional package names the extra that brings it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from zephon_core.errors import CliError, ZephonError

#: Optional packages -> the zephon-suite extra that installs them.
EXTRAS = {
    "tokenizers": "tokenizers",
    "pyarrow": "parquet",
    "s3fs": "s3",
    "torch": "torchtitan",
    "torchtitan": "torchtitan",
    "megatron": "megatron",
    "transformers": "megatron",
    "matplotlib": "plot",
}

__all__ = ["EXTRAS", "CliError", "debug_option", "one_line", "run"]


def debug_option(p: argparse.ArgumentParser, default: Any) -> None:
    p.add_argument("--debug", action="store_true", default=default, help="on an error, show the traceback (or set ZEPHON_DEBUG=1)")


def one_line(e: BaseException) -> str:
    """What the user reads: the error's own message for ours, the file and the reason for the system's."""
    if isinstance(e, (CliError, ZephonError)):
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    if isinstance(e, ModuleNotFoundError):
        top = (e.name or "").split(".")[0]
        extra = EXTRAS.get(top)
        fix = f"pip install 'zephon-suite[{extra}]'" if extra else f"pip install {top}"
        return f"this needs the {top} package, which is not installed: {fix}"
    if isinstance(e, OSError) and e.filename:
        return f"{e.filename}: {e.strerror or e}"
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text} (unexpected; run again with --debug for the traceback)"


def run(fn: Callable[[argparse.Namespace], int], args: argparse.Namespace, prog: str, *, debug: bool = False) -> int:
    """``fn(args)``, with every failure turned into one line on stderr (exit 1) unless debugging."""
    debug = debug or os.environ.get("ZEPHON_DEBUG", "") not in ("", "0")
    try:
        return int(fn(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``zephon report ... | head``): what it wanted was printed. Point stdout at devnull
        # so the interpreter's flush at exit does not fail a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        if debug:
            raise
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return 1
