"""Megatron-LM adapter for zephon_core (filled in by the Megatron integration)."""
