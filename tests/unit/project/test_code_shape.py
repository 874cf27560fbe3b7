"""The adapters and the bench keep the core's shape rules (tests/unit/core/test_architecture.py): no module,
function or class outgrows the sizes in docs/architecture.md, nothing imports in a circle, and each adapter
imports neither the other adapter nor the other framework."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.code_shape import find_cycle, imports, oversized

ROOT = Path(__file__).resolve().parents[3]
ADAPTERS = {
    "zephon_torchtitan": (ROOT / "integrations" / "torchtitan" / "zephon_torchtitan", {"megatron", "zephon_megatron"}),
    "zephon_megatron": (ROOT / "integrations" / "megatron" / "zephon_megatron", {"torchtitan", "zephon_torchtitan"}),
    "zephon_torchft": (ROOT / "integrations" / "torchft" / "zephon_torchft",
                       {"torchtitan", "zephon_torchtitan", "megatron", "zephon_megatron"}),
}


def _imports(path: Path) -> set[str]:
    return imports(ast.parse(path.read_text(), str(path)))


def test_no_module_class_or_function_of_the_adapters_or_the_dev_tools_outgrows_a_reader():
    too_big = oversized([*(ROOT / "integrations").rglob("*.py"), *(ROOT / "zephon_dev").rglob("*.py")], ROOT)
    assert not too_big, too_big


def _bench_modules() -> dict[str, Path]:
    """bench/'s own modules by import name (``goals.p1_throughput``), its caches and npm tree left out."""
    bench = ROOT / "bench"
    paths = [p for p in bench.rglob("*.py") if not {".work", "results"} & set(p.relative_to(bench).parts)]
    return {".".join(p.relative_to(bench).with_suffix("").parts).removesuffix(".__init__"): p for p in paths}


def test_no_module_class_or_function_of_the_bench_outgrows_a_reader():
    modules = _bench_modules()
    assert {"run", "report", "goals", "loaders"} <= set(modules), sorted(modules)
    too_big = oversized(modules.values(), ROOT)
    assert not too_big, too_big


def test_no_import_cycles_between_the_bench_modules():
    modules = _bench_modules()
    # bench/ is a folder of scripts: a module imports its siblings by plain name (``import report``).
    edges = {name: {m for m in _imports(p) if m in modules and not m.startswith(name + ".")}
             for name, p in modules.items()}
    cycle = find_cycle(edges)
    assert not cycle, " -> ".join(cycle)


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_an_adapter_imports_neither_the_other_adapter_nor_the_other_framework(adapter):
    folder, foreign = ADAPTERS[adapter]
    wrong = {f"{p.name}: {m}" for p in folder.glob("*.py") for m in _imports(p) if m.split(".")[0] in foreign}
    assert not wrong, sorted(wrong)


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_no_import_cycles_between_the_modules_of_an_adapter(adapter):
    folder, _ = ADAPTERS[adapter]
    modules = {p.stem: p for p in folder.glob("*.py") if p.stem != "__init__"}
    edges = {name: {m.split(".")[1] for m in _imports(p) if m.startswith(adapter + ".") and m.split(".")[1] in modules}
             for name, p in modules.items()}
    cycle = find_cycle(edges)
    assert not cycle, " -> ".join(cycle)


def _through_a_door(module: str) -> bool:
    """Whether ``module`` is ``zephon_core`` itself, or ``zephon_core.integration`` / ``zephon_core.live`` or one of
    their modules (docs/architecture.md): the names an adapter may take from the core."""
    return module == "zephon_core" or any(module == f"zephon_core.{door}" or module.startswith(f"zephon_core.{door}.")
                                          for door in DOOR)


def test_what_the_adapters_take_from_the_doors_is_there():
    import importlib

    missing = set()
    for folder, _ in ADAPTERS.values():
        for path in folder.glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module and _through_a_door(node.module):
                    module = importlib.import_module(node.module)
                    missing |= {f"{path.name}: {node.module}.{a.name}" for a in node.names
                                if not hasattr(module, a.name)}
    assert not missing, sorted(missing)


DOOR = {"integration", "live"}  # the core's packages an adapter may import; zephon_core's own exports too


def _internal(module: str) -> bool:
    """Whether ``module`` (an imported name) is one of the core's modules outside its door."""
    parts = module.split(".")
    if parts[0] != "zephon_core" or len(parts) == 1 or parts[1] in DOOR:
        return False
    core = ROOT / "zephon_core"
    return (core / parts[1]).is_dir() or (core / f"{parts[1]}.py").is_file()


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_an_adapter_enters_the_core_only_through_its_door(adapter):
    """``zephon_core``'s exports, ``zephon_core.integration`` (and its modules) and ``zephon_core.live``: nothing
    else of the core, so its internals can move without an adapter noticing (``zephon_core/integration``)."""
    folder, _ = ADAPTERS[adapter]
    wrong = {f"{p.relative_to(folder)}: {m}" for p in folder.rglob("*.py") for m in _imports(p) if _internal(m)}
    assert not wrong, sorted(wrong)
