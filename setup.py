"""Package discovery for the wheel (the rest of the metadata is in pyproject.toml).

Four code packages from four folders, and the bundled ``configs/`` (data recipes,
the demo corpus and tokenizer, the TorchTitan job file and the Megatron launch
scripts) as the data-only package ``zephon_configs``, so an installed wheel has
them too: ``zephon init`` copies them out, and the adapters' default recipes and
the demo find them (``zephon_core.integration.bundled_configs``).
"""

from pathlib import Path

from setuptools import find_packages, setup

ROOTS = {"zephon_core": ".", "zephon_torchtitan": "integrations/torchtitan", "zephon_megatron": "integrations/megatron",
         "zephon_torchft": "integrations/torchft"}

packages, package_dir = [], {"zephon_configs": "configs"}
for top, where in ROOTS.items():
    found = [p for p in find_packages(where) if p == top or p.startswith(top + ".")]
    packages += found
    package_dir.update({p: f"{where}/{p.replace('.', '/')}" for p in found})

# Folder -> the files of it that ship (what zephon_core.cli.init writes out again: its PATTERNS). The
# corpus ships with its subfolders (corpus/curriculum/ feeds the curriculum recipes), each a data package.
CONFIG_FILES = {"corpus": ["*"], "data": ["*.toml"], "megatron": ["*.sh", "*.py"], "torchtitan": ["*.toml"]}
CONFIGS = Path(__file__).resolve().parent / "configs"
CONFIG_FILES |= {sub.relative_to(CONFIGS).as_posix(): ["*"] for sub in sorted((CONFIGS / "corpus").rglob("*"))
                 if sub.is_dir() and not sub.name.startswith((".", "__"))}
config_packages = {f"zephon_configs.{d.replace('/', '.')}": files for d, files in CONFIG_FILES.items()}

setup(
    packages=[*packages, "zephon_configs", *config_packages],
    package_dir=package_dir,
    package_data=config_packages,
)
