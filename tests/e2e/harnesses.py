"""Load the TorchTitan and Megatron CPU harnesses by path (both are named harness.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


def load(framework: str) -> ModuleType:
    name = f"zephon_e2e_{framework}_harness"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{framework}_cpu" / "harness.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules[name]
