"""Trying Zephon on Megatron-LM without a GPU, and what the tests run it with: CPU only, never for real training.

``python -m zephon_megatron.cpu`` (``trial.py``) trains a tiny GPT on CPU processes, checkpoints, and resumes
on another data-parallel degree. ``shim.py`` makes Megatron's real ``pretrain()`` run on a CPU (gloo);
``entry.py`` applies it, then runs either of the adapter's entry points (torchrun's ``-m`` module);
``cp_attention.py`` and ``thd_attention.py`` stand in for TransformerEngine's attention with context
parallelism and packed sequences. Importing this package imports neither torch nor Megatron.
"""
