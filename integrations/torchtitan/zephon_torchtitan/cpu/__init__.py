"""Trying Zephon on TorchTitan without a GPU, and the launcher the tests use: CPU only, never for real training.

``python -m zephon_torchtitan.cpu`` (``trial.py``) trains llama3's debug model on CPU processes, checkpoints,
and resumes on another data-parallel degree; ``shim.py`` is what makes TorchTitan's own trainer run on a CPU
(gloo), run by torchrun by path.
"""
