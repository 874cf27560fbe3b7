"""Run a Megatron-LM training script with ``--dataloader-type zephon`` available.

    torchrun --nproc-per-node 8 -m zephon_megatron.launch pretrain_gpt.py \\
        --dataloader-type zephon --zephon-recipe configs/data/mg_train.toml \\
        --dataloader-save /ckpt/loader <the script's usual flags>

For users of a Megatron-LM checkout: their ``pretrain_gpt.py`` runs unchanged.
The launcher installs the adapter (``zephon_megatron.plugin.install``), then
executes the script as ``__main__`` with the script's folder first on
``sys.path`` (as ``python script.py`` would). When ``--dataloader-type zephon``
is given, the dataset provider the script passes to ``pretrain()`` is replaced
by Zephon's; the script's ``forward_step`` / ``get_batch`` (Megatron's
``get_batch_on_this_tp_rank`` broadcast) are used as they are. Without it the
script runs exactly as it would on its own.

``-m MODULE`` runs a module instead of a script file.
"""

from __future__ import annotations

import os
import runpy
import sys

USAGE = "usage: python -m zephon_megatron.launch (SCRIPT.py | -m MODULE) [script arguments ...]"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        print(__doc__)
        raise SystemExit(0 if argv else 2)
    from zephon_megatron import loader
    from zephon_megatron.plugin import install

    install()
    loader.ROUTE["megatron_broadcast"] = True
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit(USAGE)
        module, rest = argv[1], argv[2:]
        sys.argv = [module, *rest]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    script, rest = argv[0], argv[1:]
    if not os.path.isfile(script):
        raise SystemExit(f"zephon_megatron.launch: no such script: {script}")
    sys.argv = [script, *rest]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
