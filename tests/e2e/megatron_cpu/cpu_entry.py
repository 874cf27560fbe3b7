"""Test-only entry: apply the CPU shim, then run one of the adapter's entry points.

    cpu_entry.py launch SCRIPT [ARGS...]   ->  python -m zephon_megatron.launch SCRIPT ARGS...
    cpu_entry.py wheel [ARGS...]           ->  python -m zephon_megatron.pretrain_gpt ARGS...

The shim must be in place before Megatron is imported; the adapter's entry
points are then used exactly as a user would run them on GPUs.
"""

from __future__ import annotations

import sys

import shim  # next to this file: a script's folder is the first entry of its path

shim.apply()


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("launch", "wheel"):
        raise SystemExit("usage: cpu_entry.py (launch SCRIPT | wheel) [ARGS...]")
    route, rest = sys.argv[1], sys.argv[2:]
    if route == "launch":
        from zephon_megatron.launch import main as launch_main

        launch_main(rest)
    else:
        from zephon_megatron.pretrain_gpt import main as wheel_main

        sys.argv = ["zephon_megatron.pretrain_gpt", *rest]
        wheel_main()


if __name__ == "__main__":
    main()
