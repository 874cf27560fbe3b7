"""A progress bar on stderr for CLI work that takes a while."""

from __future__ import annotations

import argparse
import sys


class Progress:
    """A bar on stderr for work that takes a while: on a terminal, or with --progress; never with --no-progress."""

    def __init__(self, total: int, a: argparse.Namespace) -> None:
        enabled = a.progress or (not a.no_progress and sys.stderr.isatty())
        self.total, self.done, self.enabled = total, 0, enabled

    def step(self, label: str) -> None:
        self.done += 1
        if self.enabled:
            width = 30
            filled = width * self.done // max(1, self.total)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {label}   ")
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
