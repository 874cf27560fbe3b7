"""Plots of bench/results/results.json: ``python bench/plot.py results.json OUT_DIR`` (needs matplotlib).

Each goal that draws a figure has its own ``plot.py`` in its package (bench/goals/<goal>/plot.py: ``KEY``, the
results.json entry it reads, and ``plot(R, out)``, which writes one PNG and returns its name; the style they share
is bench/plot_style.py). This draws every one whose entry the results have.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

import plot_style  # noqa: F401  (the file-only backend, before any figure module imports pyplot)


def figures() -> list[ModuleType]:
    """Every goal package's plot module (bench/goals/<goal>/plot.py)."""
    import goals

    return [importlib.import_module(f"goals.{m.name}.plot") for m in pkgutil.iter_modules(goals.__path__)
            if m.ispkg and importlib.util.find_spec(f"goals.{m.name}.plot") is not None]


def main() -> None:
    R = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for fig in figures():
        if fig.KEY in R:
            try:
                print(out / fig.plot(R, out))
            except Exception as e:  # one broken plot must not hide the others
                print(f"{fig.KEY}: {e!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
