"""The layout of the suite: tests mirror zephon_core's packages, shared helpers live in tests/support,
nothing in tests/ or bench/ edits sys.path, and what ships (the demo, its CPU launcher) imports nothing from tests/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _python_files(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py"))


def _edits_sys_path(tree: ast.AST, removals: bool = True) -> bool:
    """Whether the module puts folders on ``sys.path`` (or, with ``removals``, changes it at all)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("insert", "append", "extend"):
            target = node.func.value
            if isinstance(target, ast.Attribute) and target.attr == "path" and isinstance(target.value, ast.Name) and target.value.id == "sys":
                return True
        if removals and isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) and ast.unparse(t.value) == "sys.path" for t in node.targets):
            return True
    return False


def test_no_test_edits_sys_path():
    edits = [str(p.relative_to(ROOT)) for p in _python_files("tests") if _edits_sys_path(ast.parse(p.read_text(), str(p)))]
    assert not edits, f"these edit sys.path (pytest's pythonpath has tests/ and scripts/: import support.X instead): {edits}"


def test_no_bench_module_edits_sys_path():
    # bench/ is a folder of scripts: a script's folder is already first on sys.path, and the Runner gives the
    # cases their PYTHONPATH (bench/harness.py).
    files = [p for p in _python_files("bench") if ".work" not in p.parts]
    assert len(files) > 10, "bench/ has moved: point this test at it"
    edits = [str(p.relative_to(ROOT)) for p in files if _edits_sys_path(ast.parse(p.read_text(), str(p)))]
    assert not edits, f"these bench modules edit sys.path: {edits}"


def test_the_unit_tests_of_the_core_mirror_its_packages():
    core = ROOT / "zephon_core"
    packages = {p.name for p in core.iterdir() if (p / "__init__.py").exists()}
    folders = {p.name for p in (ROOT / "tests" / "unit" / "core").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= packages, f"test folders without a package: {sorted(folders - packages)}"
    assert packages - folders <= set(), f"packages without a test folder: {sorted(packages - folders)}"


def test_the_demo_imports_nothing_from_tests():
    for p in _python_files("scripts"):
        tree = ast.parse(p.read_text(), str(p))
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        from_tests = sorted(n for n in names if n.split(".")[0] in {"support", "tt_runs", "harnesses"} or n.startswith("tests"))
        assert not from_tests, f"{p.relative_to(ROOT)} imports {from_tests} from tests/"
        # The CPU launcher takes its own folder off the path (its modules must shadow nothing): allowed.
        assert not _edits_sys_path(tree, removals=False), f"{p.relative_to(ROOT)} puts a folder on sys.path"


def test_the_module_map_names_every_module_of_the_core():
    readme = (ROOT / "zephon_core" / "README.md").read_text()
    missing = [str(p.relative_to(ROOT / "zephon_core")) for p in sorted((ROOT / "zephon_core").rglob("*.py"))
               if p.name != "__init__.py" and str(p.relative_to(ROOT / "zephon_core")) not in readme and f"`{p.name}`" not in readme]
    assert not missing, f"zephon_core/README.md's module map does not name: {missing}"
