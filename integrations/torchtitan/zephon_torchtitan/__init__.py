"""TorchTitan adapter for zephon_core (filled in by the TorchTitan integration)."""
