"""TorchTitan on CPU for the demo (scripts/demo.sh) and the e2e tests: the harness and the runs they share.

TorchTitan assumes CUDA; the CPU shim ``zephon_torchtitan/cpu/shim.py`` (the one ``python -m
zephon_torchtitan.cpu`` runs) makes its trainer run on CPU over gloo (docs/torchtitan.md, "On CPU");
``harness.run_torchtitan`` launches it under torchrun with a timeout, ``runs.launch`` runs Zephon's
recipe through it.
"""
