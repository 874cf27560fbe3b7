"""Checkpoints: the state schema (``state``), merging per-group states (``merge``) and the
file-based protocol through which rank 0 merges every rank's progress (``aggregate``)."""

from zephon_core.checkpoint.merge import diff_definitions, merge_states
from zephon_core.checkpoint.state import LaneState, make_state, parse_lanes, verify_checksum

__all__ = ["LaneState", "diff_definitions", "make_state", "merge_states", "parse_lanes", "verify_checksum"]
