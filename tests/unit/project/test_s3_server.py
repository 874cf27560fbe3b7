"""The local moto S3 server helper (zephon_dev/s3_server.py) and the s3_endpoint fixture."""

import os
import pickle
import socket
from urllib.parse import urlparse

import pytest

from zephon_dev import s3_server


def test_write_read_list_through_fsspec(s3_endpoint):
    import fsspec

    url = s3_endpoint.url("unit", "hello.bin")
    with fsspec.open(url, "wb", **s3_endpoint) as f:
        f.write(b"\x00zephon\xff")
    with fsspec.open(url, "rb", **s3_endpoint) as f:
        assert f.read() == b"\x00zephon\xff"

    fs = fsspec.filesystem("s3", **s3_endpoint)
    fs.invalidate_cache()
    assert fs.ls(s3_endpoint.url("unit"), detail=False) == [f"{s3_endpoint.bucket}/unit/hello.bin"]
    assert fs.info(url)["size"] == 8


def test_endpoint_is_loopback_and_env_is_set(s3_endpoint):
    import fsspec

    parsed = urlparse(s3_endpoint.endpoint_url)
    assert parsed.hostname == "127.0.0.1" and parsed.port not in (None, 0, 5000)
    assert s3_endpoint["client_kwargs"]["endpoint_url"] == s3_endpoint.endpoint_url
    assert os.environ["AWS_ENDPOINT_URL_S3"] == s3_endpoint.endpoint_url
    # env alone is enough for s3fs/botocore
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.pipe(s3_endpoint.url("unit", "env.txt"), b"via env")
    assert fs.cat(s3_endpoint.url("unit", "env.txt")) == b"via env"


def test_endpoint_pickles(s3_endpoint):
    copy = pickle.loads(pickle.dumps(s3_endpoint))
    assert copy == s3_endpoint and type(copy) is s3_server.S3Endpoint
    assert (copy.endpoint_url, copy.bucket) == (s3_endpoint.endpoint_url, s3_endpoint.bucket)
    assert copy.storage_options == dict(s3_endpoint)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_standalone_server_starts_and_stops(mode):
    with s3_server.start_s3_server(bucket="other-bucket", mode=mode, set_env=False) as ep:
        fs = ep.filesystem()
        fs.pipe(ep.url("x.txt"), b"x")
        assert fs.ls(ep.url(), detail=False) == ["other-bucket/x.txt"]
        port = urlparse(ep.endpoint_url).port
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
