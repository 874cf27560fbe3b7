"""TorchTitan on CPU: the launcher, harness and runs that the demo (scripts/demo.sh) and the e2e tests share.

TorchTitan assumes CUDA; ``launch.py`` runs its trainer on CPU over gloo (docs/torchtitan.md, "On CPU"),
``harness.run_torchtitan`` launches it under torchrun with a timeout, ``runs.launch`` runs Zephon's recipe
through it.
"""
