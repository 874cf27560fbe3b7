"""The ``zephon`` command line (``python -m zephon_core.cli``): one module per command, each with
``register(sub)`` (its parser) and ``run(args)``; ``app`` lists them and runs one, ``errors`` turns a
failure into one line, ``options`` holds what several commands share, ``demo`` is the core-only
elastic demo (``python -m zephon_core.cli.demo``)."""

from zephon_core.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
