"""CPU only: apply the shim, then run one of the adapter's entry points, as torchrun's script.

    torchrun ... -m zephon_megatron.cpu.entry launch SCRIPT [ARGS...]   ->  -m zephon_megatron.launch SCRIPT ARGS...
    torchrun ... -m zephon_megatron.cpu.entry wheel [ARGS...]           ->  -m zephon_megatron.pretrain_gpt ARGS...

The shim must be in place before Megatron is imported (importing ``zephon_megatron`` imports neither
torch nor Megatron); the adapter's entry points are then used exactly as a user runs them on GPUs.
"""

from __future__ import annotations

import sys

from zephon_megatron.cpu import shim

shim.apply()


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("launch", "wheel"):
        raise SystemExit("usage: python -m zephon_megatron.cpu.entry (launch SCRIPT | wheel) [ARGS...]")
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
