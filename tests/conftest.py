"""Suite-wide fixtures.

``s3_endpoint`` (session): a local moto S3 server on 127.0.0.1:<free port>
with the bucket ``s3_endpoint.bucket`` created and the AWS_* environment
pointing at it. The value is the fsspec storage-options dict, so

    fs = fsspec.filesystem("s3", **s3_endpoint)
    with fsspec.open(s3_endpoint.url("a/b.bin"), "wb", **s3_endpoint) as f: ...

Under MPI (tests/distributed) the fixture of the same name is overridden so
that rank 0 owns the one server and all ranks share it.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def s3_endpoint():
    from zephon_dev import s3_server
    mode = os.environ.get("ZEPHON_TEST_S3_MODE", "thread")
    with s3_server.S3Server(mode=mode) as ep, pytest.MonkeyPatch.context() as mp:
        for name, value in s3_server.s3_env(ep).items():
            if value:
                mp.setenv(name, value)
            else:
                mp.delenv(name, raising=False)
        yield ep
