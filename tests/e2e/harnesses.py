"""The TorchTitan and Megatron CPU harnesses (both modules are named harness.py).

TorchTitan's is the package ``torchtitan_cpu`` in scripts/ (the demo runs it too); Megatron's is
test-only, in tests/e2e/megatron_cpu, loaded from its file.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


def load(framework: str) -> ModuleType:
    if framework == "torchtitan":
        return importlib.import_module("torchtitan_cpu.harness")
    name = f"zephon_e2e_{framework}_harness"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{framework}_cpu" / "harness.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules[name]
