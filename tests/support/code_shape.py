"""The sizes a reader can hold in mind (docs/architecture.md), measured on any Python files: the
architecture tests of the core, the adapters and the bench share them."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_INSTANCE_ATTRIBUTES = 420, 60, 12


def imports(tree: ast.AST) -> set[str]:
    """Every module a file imports anywhere (also inside functions), and ``module.name`` for each name taken
    from one (it may be a submodule)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def oversized(paths: Iterable[Path], root: Path) -> list[str]:
    """``file: what`` for every module, function or class of ``paths`` over the limits."""
    too_big = []
    for path in sorted(paths):
        text = path.read_text()
        rel = path.relative_to(root)
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_big.append(f"{rel}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_big.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
            if isinstance(node, ast.ClassDef):
                attrs = {sub.attr for sub in ast.walk(node)
                         if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
                         and isinstance(sub.value, ast.Name) and sub.value.id == "self"}
                if len(attrs) > MAX_INSTANCE_ATTRIBUTES:
                    too_big.append(f"{rel}:{node.lineno} {node.name}: {len(attrs)} instance attributes")
    return too_big


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (module -> the modules it imports) as ``[a, b, ..., a]``, or ``[]``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycle: list[str] = []

    def visit(name: str, path: list[str]) -> None:
        if cycle or state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle.extend(path[path.index(name):] + [name])
            return
        state[name] = 1
        for nxt in sorted(graph.get(name, set()) - {name}):
            visit(nxt, path + [name])
        state[name] = 2

    for name in sorted(graph):
        visit(name, [])
    return cycle
