"""Package discovery for the wheel (the rest of the metadata is in pyproject.toml).

Four code packages from four folders, and the bundled ``configs/`` (data recipes,
the demo corpus and tokenizer, the TorchTitan job file and the Megatron launch
scripts) as the data-only package ``zephon_configs``, so an installed wheel has
them too: ``zephon init`` copies them out, and the adapters' default recipes and
the demo find them (``zephon_core.integration.bundled_configs``).
"""

from setuptools import find_packages, setup

ROOTS = {"zephon_core": ".", "zephon_torchtitan": "integrations/torchtitan", "zephon_megatron": "integrations/megatron",
         "zephon_torchft": "integrations/torchft"}

packages, package_dir = [], {"zephon_configs": "configs"}
for top, where in ROOTS.items():
    found = [p for p in find_packages(where) if p == top or p.startswith(top + ".")]
    packages += found
    package_dir.update({p: f"{where}/{p.replace('.', '/')}" for p in found})

# Folder -> the files of it that ship (what zephon_core.cli.init writes out again).
CONFIG_FILES = {"corpus": ["*"], "data": ["*.toml"], "megatron": ["*.sh", "*.py"], "torchtitan": ["*.toml"]}

setup(
    packages=[*packages, "zephon_configs", *(f"zephon_configs.{d}" for d in CONFIG_FILES)],
    package_dir=package_dir,
    package_data={f"zephon_configs.{d}": files for d, files in CONFIG_FILES.items()},
)
