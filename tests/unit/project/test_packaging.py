"""The distribution installs as users get it: packages, the ``zephon`` console script, the bundled
configs, and core dependencies and extras that match what each command imports.

The wheel tests are offline and fast: the wheel is built without build isolation and installed
with ``--no-index --no-deps`` into a fresh venv that sees only the installed distributions it
names (linked from this environment's site-packages), as ``pip install .`` would give them.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DIST_OF_IMPORT = {"torch": "torch", "torchtitan": "torchtitan", "megatron": "megatron-core", "numpy": "numpy", "tokenizers": "tokenizers",
                  "fsspec": "fsspec", "omegaconf": "omegaconf", "pyarrow": "pyarrow", "s3fs": "s3fs", "transformers": "transformers",
                  "matplotlib": "matplotlib", "torchft": "torchft"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower()


def test_wheel_installs_packages_and_console_script(tmp_path):
    target = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(ROOT)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    for package in ("zephon_core", "zephon_torchtitan", "zephon_megatron"):
        assert (target / package / "__init__.py").is_file(), f"{package} missing from the wheel"
    for sub in (p for p in (ROOT / "zephon_core").rglob("__init__.py")):
        assert (target / sub.relative_to(ROOT)).is_file(), f"{sub.parent.name} missing from the wheel"
    assert not (target / "tests").exists()
    assert not (target / "zephon_dev").exists(), "zephon_dev is a development package: never in the wheel"
    script = target / "bin" / "zephon"
    assert script.is_file()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    r = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0 and "verify-elastic" in r.stdout and "init" in r.stdout, r.stderr


def _closure(names: list[str]) -> set[str]:
    """These distributions and everything they require (without extras), as installed here."""
    seen: set[str] = set()
    todo = [n.lower() for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for req in map(Requirement, metadata.distribution(name).requires or []):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name.lower())
    return seen


def _link_distributions(names: set[str], into: Path) -> None:
    """Make exactly these installed distributions importable from ``into`` (symlinks to their top-level files)."""
    into.mkdir(parents=True, exist_ok=True)
    for name in names:
        dist = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = Path(dist.locate_file(top))
            if src.exists() and not (into / top).exists():
                (into / top).symlink_to(src)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from this clone as `pip wheel .` builds it (offline: no build isolation)."""
    root = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(root),
                            str(ROOT)],
                           capture_output=True, text=True, timeout=600, cwd=root)
    assert built.returncode == 0, built.stderr[-2000:]
    # setuptools' deprecations (a license table, package data outside `packages`) are build failures waiting.
    assert "Warning" not in built.stdout + built.stderr, (built.stdout + built.stderr)[-3000:]
    (whl,) = root.glob("*.whl")
    return whl


def _venv(root: Path, wheel: Path, distributions: list[str]) -> tuple[Path, Path]:
    """A fresh venv in ``root`` with ``wheel`` and exactly ``distributions`` (with what they require) importable."""
    venv = root / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # Without PYTHONPATH: a clone on it (with its .egg-info) would look like an installed zephon-suite to pip.
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-index", "--no-deps", str(wheel)],
                               capture_output=True, text=True, timeout=600, env=clean)
    assert installed.returncode == 0, installed.stderr[-2000:]
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    deps = root / "deps"
    _link_distributions(_closure(distributions), deps)
    (site / "zephon-deps.pth").write_text(f"{deps}\n")
    return venv, deps


@pytest.fixture(scope="module")
def core_venv(wheel, tmp_path_factory):
    """A fresh venv with the wheel and only the core dependencies: what `pip install .` gives."""
    root = tmp_path_factory.mktemp("core-venv")
    venv, deps = _venv(root, wheel, [_name(r) for r in PYPROJECT["project"]["dependencies"]])
    return venv, deps, root


def _in(venv: Path, cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin"
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_core_wheel_alone_gives_a_working_cli_and_the_configs(core_venv, tmp_path):
    venv, deps, _ = core_venv
    assert _in(venv, "python -c 'import tokenizers'", tmp_path).returncode != 0, "the test venv must not see tokenizers"
    r = _in(venv, "zephon init && ls configs/data configs/corpus configs/torchtitan configs/megatron", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "demo.toml" in r.stdout and "tokenizer.json" in r.stdout and "llama3_debug_zephon_022.toml" in r.stdout
    assert _in(venv, "zephon init", tmp_path).returncode == 1  # never overwrites without --force
    # Commands that need an extra say which, in one line.
    for cmd in ("zephon explain configs/data/demo.toml", "python -m zephon_core.cli.demo",
                "zephon trace configs/data/tt_train.toml --step 1 --framework torchtitan --tokenizer configs/corpus"):
        r = _in(venv, cmd, tmp_path)
        assert r.returncode == 1 and r.stderr.strip().splitlines() == [r.stderr.strip()], (cmd, r.stderr)
        assert "pip install 'zephon-suite[tokenizers]'" in r.stderr and "Traceback" not in r.stderr, (cmd, r.stderr)
    # A framework checkpoint needs its adapter's extra (which brings torch), not a bare `pip install torch`.
    (tmp_path / "step-4").mkdir()
    (tmp_path / "iter.pt").write_bytes(b"\x80")
    for path, extra in (("step-4", "torchtitan"), ("iter.pt", "megatron")):
        r = _in(venv, f"zephon inspect {path}", tmp_path)
        assert r.returncode == 1 and f"pip install 'zephon-suite[{extra}]'" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    # Recipes need nothing more than the core: diff reads two of them.
    r = _in(venv, "zephon diff configs/data/tt_train.toml configs/data/mg_train.toml", tmp_path)
    assert r.returncode == 1 and "canonical_replicas: 4 vs 8" in r.stdout, r.stdout + r.stderr


def test_core_wheel_with_tokenizers_runs_the_demo_outside_the_clone(core_venv, tmp_path):
    venv, deps, root = core_venv
    _link_distributions(_closure(["tokenizers"]), deps)
    r = _in(venv, "python -m zephon_core.cli.demo", tmp_path)
    assert r.returncode == 0 and "all 10 global steps matched" in r.stdout, r.stdout + r.stderr
    r = _in(venv, "python -c 'from zephon_core.integration import bundled_configs; print(bundled_configs())'", tmp_path)
    assert Path(r.stdout.strip()).is_relative_to(venv) and not Path(r.stdout.strip()).is_relative_to(ROOT), r.stdout + r.stderr


#: How a user explains each bundled recipe: a [standalone] one as it is, a training one with its framework's shape.
TT_SHAPE = "--framework torchtitan --tokenizer configs/corpus"
MG_SHAPE = "--framework megatron --tokenizer configs/corpus --seq-len 128 --batch-size 2"
EXPLAINED = {"demo": "", "curriculum": "", "curriculum_main": "", "tt_train": TT_SHAPE, "tt_heldout": TT_SHAPE,
             "mg_train": MG_SHAPE, "mg_heldout": MG_SHAPE}


@pytest.fixture(scope="module")
def user_venv(wheel, tmp_path_factory):
    """What `pip install 'zephon-suite[tokenizers,plot]'` gives, in a folder where `zephon init` ran."""
    root = tmp_path_factory.mktemp("user-venv")
    extras = PYPROJECT["project"]["optional-dependencies"]
    wanted = PYPROJECT["project"]["dependencies"] + extras["tokenizers"] + extras["plot"]
    venv, _ = _venv(root, wheel, [_name(r) for r in wanted])
    work = root / "work"
    work.mkdir()
    r = _in(venv, "zephon init", work)
    assert r.returncode == 0, r.stdout + r.stderr
    return venv, work


def test_every_bundled_recipe_explains_from_an_installed_wheel(user_venv):
    venv, work = user_venv
    recipes = {p.stem for p in (ROOT / "configs" / "data").glob("*.toml")}
    # mg_indexed reads what make_indexed_corpus.py writes with megatron-core (the [megatron] extra): the error says so.
    assert recipes == set(EXPLAINED) | {"mg_indexed"}, "a new bundled recipe needs its line in EXPLAINED"
    committed = subprocess.run(["git", "ls-files", "configs"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
    written = {p.relative_to(work).as_posix() for p in (work / "configs").rglob("*") if p.is_file()}
    assert written == set(committed), sorted(written ^ set(committed))  # every committed config ships, subfolders too
    for name, shape in EXPLAINED.items():
        r = _in(venv, f"zephon explain configs/data/{name}.toml {shape}", work)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (name, r.stdout[-1000:] + r.stderr)
    r = _in(venv, f"zephon explain configs/data/mg_indexed.toml {MG_SHAPE}", work)
    assert r.returncode == 1 and "make_indexed_corpus.py" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = _in(venv, "zephon explain configs/data/curriculum.toml --plot plan.png --plot-steps 90", work)
    assert r.returncode == 0 and (work / "plan.png").stat().st_size > 10_000, r.stdout + r.stderr


def test_readme_ten_lines_run_from_an_installed_wheel(user_venv):
    venv, work = user_venv
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## A pipeline in ten lines"):]
    code = section[section.index("```python") + len("```python"):section.index("```", section.index("```python") + 3)]
    shown = "print(batch.input_ids.shape, batch.positions.shape, len(state['lanes']))"
    (work / "ten_lines.py").write_text(f"{code}\n{shown}\n")
    r = _in(venv, "python ten_lines.py", work)
    assert r.returncode == 0, r.stdout + r.stderr
    # As its comments and the lines after it say: [2, 128] arrays; a group's state holds its own 2 of the 8 lanes.
    assert r.stdout.split() == ["(2,", "128)", "(2,", "128)", "2"], r.stdout


def _third_party_imports(folder: Path) -> set[str]:
    found: set[str] = set()
    for f in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found |= {n.split(".")[0] for n in names if n.split(".")[0] in DIST_OF_IMPORT}
    return found


def test_extras_name_what_each_route_imports():
    core = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    extras = {k: {_name(r) for r in v} for k, v in PYPROJECT["project"]["optional-dependencies"].items()}
    for adapter, folder in (("torchtitan", "integrations/torchtitan"), ("megatron", "integrations/megatron"),
                            ("torchft", "integrations/torchft")):
        needed = {DIST_OF_IMPORT[m] for m in _third_party_imports(ROOT / folder)}
        assert needed <= core | extras[adapter], f"[{adapter}] lacks {sorted(needed - core - extras[adapter])}"
    # Megatron's HuggingFaceTokenizer (configs/megatron/common.sh) imports transformers; the project env has it too.
    assert "--tokenizer-type HuggingFaceTokenizer" in (ROOT / "configs" / "megatron" / "common.sh").read_text()
    assert "transformers" in extras["megatron"]
    env_pins = {_name(line) for line in (ROOT / "requirements" / "env.txt").read_text().splitlines() if line.strip() and not line.startswith("#")}
    assert "transformers" in env_pins
    from zephon_core.cli.errors import EXTRAS

    for module, extra in EXTRAS.items():  # every extra the CLI names exists and brings that module
        assert DIST_OF_IMPORT[module] in extras[extra] or module == "megatron" and "megatron-core" in extras[extra], (module, extra)
