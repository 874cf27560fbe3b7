"""Helpers shared by the test suites (pytest puts ``tests/`` on the path: ``from support.s3_server import S3Server``).

- ``s3_server``: a moto S3 server on loopback; ``s3_proxy``: a fault and latency proxy in front of it;
- ``core_fixtures``: documents whose tokens name their origin, tiny pipelines, a per-test index cache,
  the exactly-once check of an epoch through a resize (``epoch_exactly_once``);
- ``property_strategies``: hypothesis strategies of recipes and topologies;
- ``simranks``: many simulated ranks in one process; ``tensorboard_events``: TensorBoard scalars read back;
- ``doc_commands``: the commands the docs show.
"""
