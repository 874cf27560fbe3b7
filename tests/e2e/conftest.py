"""End-to-end tests: real training loops under torchrun on CPU (slow; ~25 s per launch).

The two frameworks' CPU harnesses both live in modules named ``harness``;
load them by path (``harnesses.load``) rather than through sys.path.
"""
