"""Helpers only the test suites use (pytest puts ``tests/`` on the path: ``from support.simranks import ...``).
What the bench shares with the tests (the S3 server and proxy, fsops, torchft drills) is ``zephon_dev``.

- ``core_fixtures``: documents whose tokens name their origin, tiny pipelines, a per-test index cache,
  the exactly-once check of an epoch through a resize (``epoch_exactly_once``);
- ``property_strategies``: hypothesis strategies of recipes and topologies;
- ``simranks``: many simulated ranks in one process; ``tensorboard_events``: TensorBoard scalars read back;
- ``doc_commands``: the commands the docs show.
"""
