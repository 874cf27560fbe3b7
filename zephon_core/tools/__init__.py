"""Tools around pipelines: the ``zephon`` command line (``cli``), whole-topology simulation
(``simulate``), the core-only demo (``demo``), the batch audit log (``audit``) and the
registry of framework checkpoint readers (``state_readers``)."""
