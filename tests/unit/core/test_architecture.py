"""The shape of zephon_core, kept: layers import only downwards, nothing imports in a circle,
the core never imports an adapter or torch, and no module, class or function outgrows the
sizes a reader can hold in mind (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

from support.code_shape import find_cycle, imports, oversized

CORE = Path(__file__).resolve().parents[3] / "zephon_core"

# Lower layers never import higher ones; a layer may import itself (checked for cycles below).
LAYERS = ["errors", "validation", "batch", "metrics", "arrays", "io", "sources", "curriculum", "lane", "checkpoint",
          "pipeline", "live", "recipe", "integration", "verify", "report", "cli"]
RANK = {"errors": 0, "validation": 1, "batch": 1, "metrics": 1, "arrays": 1, "io": 2, "sources": 3, "curriculum": 4,
        "lane": 5, "checkpoint": 5, "pipeline": 6, "live": 7, "recipe": 7, "integration": 8, "verify": 9, "report": 10,
        "cli": 11}


def modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(CORE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def layer(module: str) -> str:
    return module.split(".")[1]


def test_every_module_belongs_to_a_layer():
    assert sorted({layer(m) for m in modules() if m != "zephon_core"}) == sorted(LAYERS)


def test_layers_import_only_downwards_and_never_an_adapter_or_torch():
    bad = []
    for name, tree in modules().items():
        if name == "zephon_core":
            continue
        for imp in imports(tree):
            top = imp.split(".")[0]
            if top in ("torch", "torchtitan", "megatron", "torchft", "zephon_torchtitan", "zephon_megatron",
                       "zephon_torchft", "zephon_dev"):
                bad.append(f"{name} imports {imp}")
            if top == "zephon_core" and imp != "zephon_core" and imp.count(".") >= 1 and layer(imp) in RANK:
                if RANK[layer(imp)] > RANK[layer(name)]:
                    bad.append(f"{name} ({layer(name)}) imports {imp} ({layer(imp)}), a higher layer")
    assert not bad, bad


def test_no_import_cycles_between_modules():
    mods = modules()
    graph = {name: {i for i in imports(tree) if i in mods and i != name and i != "zephon_core"} for name, tree in mods.items()}
    # Package __init__ files re-export their modules; an __init__ importing its own children is not a cycle.
    for name in graph:
        graph[name] = {i for i in graph[name] if not i.startswith(name + ".")}
    cycle = find_cycle(graph)
    assert not cycle, " -> ".join(cycle)


def test_no_module_class_or_function_outgrows_a_reader():
    too_big = oversized(CORE.rglob("*.py"), CORE.parent)
    assert not too_big, too_big
