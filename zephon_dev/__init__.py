"""Development helpers that the tests and the bench share; never part of the wheel (setup.py names the packages
it ships, and this is not one of them).

- ``s3_server``: a moto S3 server on loopback (a thread or a child process); ``s3_proxy``: a fault and latency
  proxy in front of an S3 endpoint; ``s3rver``: a second, node-based S3-compatible server (its npm pins and the
  patch beside its launcher);
- ``fsops``: a file system wrapper that counts the operations and bytes of a checkpoint's I/O;
- ``torchft_drill``: real torchft drills (a lighthouse and replica-group processes) and their logs read back.

Importable from the repository root: pytest's ``pythonpath`` has it, the bench's Runner gives it to every
measurement, and a hand-run script takes ``PYTHONPATH=.``.
"""
