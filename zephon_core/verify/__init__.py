"""Whole topologies checked in one process: ``simulate`` (running a schedule of topologies against the
uninterrupted reference), ``curriculum_audit`` (no document repeats within a source epoch or is skipped)
and ``shape`` (the pipeline a framework's run built, rebuilt from its recipe and its shape)."""
