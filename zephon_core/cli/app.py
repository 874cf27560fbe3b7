"""The ``zephon`` command line: plan, inspect, compare, verify, trace and report on data.

Every command takes ``--help``; ``zephon --version`` prints the installed version. Errors print one
line and exit 1 (``--debug`` or ``ZEPHON_DEBUG=1`` adds the traceback); usage errors exit 2, and a
bare ``zephon`` (no command) is one: it prints this help on stdout and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from zephon_core.cli import (
    blame,
    diff,
    explain,
    from_megatron,
    index,
    init,
    inspect,
    ledger,
    quarantine,
    report,
    skip,
    trace,
    verify_elastic,
)
from zephon_core.cli.errors import debug_option, run

#: Every command, in the order ``zephon --help`` lists them: a module with ``register(sub)``, which adds
#: its parser and sets ``fn`` to the function that runs it.
COMMANDS = (explain, inspect, diff, verify_elastic, trace, report, index, init, from_megatron,
            skip, quarantine, ledger, blame)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="zephon",
                                 description="Plan, inspect, compare, verify, trace and report on Zephon pipelines.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    for sp in sub.choices.values():
        debug_option(sp, argparse.SUPPRESS)
    debug_option(ap, False)
    ap.add_argument("--version", action="version", version=f"zephon {_version()}")
    return ap


def _version() -> str:
    """The installed distribution's version; the package's own in a clone that is not installed."""
    from importlib import metadata

    try:
        return metadata.version("zephon-suite")
    except metadata.PackageNotFoundError:
        from zephon_core import __version__

        return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):
        parser.print_help()
        return 2
    args = parser.parse_args(argv)
    return run(args.fn, args, f"zephon {args.command}", debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
