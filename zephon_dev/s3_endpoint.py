"""Where the test S3 server is, as clients need it: fsspec storage options (``S3Endpoint``) and the AWS_*
environment that points boto3/botocore/s3fs at it (``s3_env``, ``apply_env``). ``zephon_dev.s3_server`` starts
the server and hands these out."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

HOST = "127.0.0.1"
REGION = "us-east-1"
KEY = "zephon-test-key"
SECRET = "zephon-test-secret"


class S3Endpoint(dict):
    """fsspec storage options for the test server, plus where it is.

    It is a plain ``dict`` of storage options, so ``fsspec.filesystem("s3",
    **ep)`` and ``fsspec.open(url, **ep)`` work as is; the extra attributes
    survive pickling (and so ``comm.bcast``).
    """

    def __init__(self, endpoint_url: str, bucket: str):
        super().__init__(
            client_kwargs={"endpoint_url": endpoint_url, "region_name": REGION},
            key=KEY,
            secret=SECRET,
        )
        self.endpoint_url = endpoint_url
        self.bucket = bucket

    @property
    def storage_options(self) -> dict:
        """A fresh plain-dict copy (safe to mutate)."""
        return {
            "client_kwargs": dict(self["client_kwargs"]),
            "key": self["key"],
            "secret": self["secret"],
        }

    def url(self, *parts: str) -> str:
        """``s3://<bucket>/<parts joined by '/'>``."""
        tail = "/".join(p.strip("/") for p in parts if p)
        return f"s3://{self.bucket}/{tail}" if tail else f"s3://{self.bucket}"

    def filesystem(self, **extra: Any):
        """An s3fs filesystem for this endpoint (not fsspec's cached one)."""
        import fsspec

        return fsspec.filesystem("s3", skip_instance_cache=True, **self.storage_options, **extra)

    def __reduce__(self):
        return (type(self), (self.endpoint_url, self.bucket))

    def __repr__(self) -> str:
        return f"S3Endpoint({self.endpoint_url!r}, bucket={self.bucket!r})"


def s3_env(endpoint: S3Endpoint) -> dict[str, str]:
    """Environment that points boto3/botocore/s3fs at ``endpoint``."""
    no_proxy = [h for h in os.environ.get("NO_PROXY", "").split(",") if h]
    for h in (HOST, "localhost"):
        if h not in no_proxy:
            no_proxy.append(h)
    return {
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SESSION_TOKEN": "",
        "AWS_SECURITY_TOKEN": "",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "AWS_ENDPOINT_URL": endpoint.endpoint_url,
        "AWS_ENDPOINT_URL_S3": endpoint.endpoint_url,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "NO_PROXY": ",".join(no_proxy),
        "no_proxy": ",".join(no_proxy),
    }


def apply_env(endpoint: S3Endpoint, environ: Any = None) -> Callable[[], None]:
    """Set ``s3_env(endpoint)`` in ``environ`` (default ``os.environ``).

    Empty values unset the variable. Returns a function restoring the old
    values. (pytest users can use ``monkeypatch.setenv`` instead.)
    """
    env = os.environ if environ is None else environ
    saved = {k: env.get(k) for k in s3_env(endpoint)}
    for k, v in s3_env(endpoint).items():
        if v:
            env[k] = v
        else:
            env.pop(k, None)

    def undo() -> None:
        for k, old in saved.items():
            if old is None:
                env.pop(k, None)
            else:
                env[k] = old

    return undo
