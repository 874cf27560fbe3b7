"""A local, throwaway S3 endpoint for tests (moto's standalone server).

The server listens on 127.0.0.1 on a port chosen by the kernel (never a fixed
one), so concurrent test runs on one machine do not collide, and every process
on the machine (MPI ranks, torchrun workers, subprocesses) can reach it over
loopback.

Three ways in:

* ``S3Endpoint`` / ``start_s3_server()``: start a server, create a bucket, get
  the fsspec storage options (the returned object *is* that dict).
* ``s3_env(endpoint)``: the AWS_* environment that makes boto3/s3fs talk to it
  without explicit options (``apply_env`` sets it and returns an undo).
* ``shared_s3_server(comm)``: the MPI variant: rank 0 owns the server, every
  rank gets the same endpoint through ``comm.bcast``.

Running ``python -m zephon_dev.s3_server --serve`` (from the repository root) serves until
stdin closes and prints the endpoint URL as its first stdout line; the ``mode="process"``
server uses that.

Don't mix the in-thread server with ``moto.mock_aws`` in the same process:
both use moto's process-global backends. Use ``mode="process"`` there.

``S3Server(latency_s=0.02)`` delays every request by 20 ms inside the server (as a
remote store would, without using CPU) and counts the requests by kind;
``S3Server.stats()`` returns the counts (``reset_stats()`` zeroes them). The counts
come from the server, so they include every request the client library makes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from zephon_dev.s3_endpoint import HOST, KEY, REGION, SECRET, S3Endpoint, apply_env, s3_env

DEFAULT_BUCKET = "zephon-test"

__all__ = [
    "S3Endpoint",
    "S3Server",
    "start_s3_server",
    "s3_env",
    "apply_env",
    "shared_s3_server",
    "soft_barrier",
    "STATS_PATH",
]

#: A path no bucket can have: GET returns the request counts, DELETE zeroes them.
STATS_PATH = "/__zephon__/stats"


def _quiet_werkzeug() -> None:
    # one INFO line per request otherwise ends up in every failing test's report
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)


class _Throttle:
    """WSGI middleware in front of moto: a fixed delay per request, and counts of requests by kind."""

    def __init__(self, app, latency_s: float) -> None:
        import threading

        self.app, self.latency_s = app, latency_s
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}

    @staticmethod
    def kind(environ) -> tuple[str, int]:
        method, query = environ["REQUEST_METHOD"], environ.get("QUERY_STRING", "")
        key = environ.get("PATH_INFO", "").lstrip("/").partition("/")[2]
        if method == "POST" and "delete" in query:
            import io

            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            environ["wsgi.input"] = io.BytesIO(body)
            return "delete", max(1, body.count(b"<Key>"))
        if method == "GET" and not key:
            return "list", 1
        return {"GET": "get", "PUT": "put", "HEAD": "head", "DELETE": "delete"}.get(method, method.lower()), 1

    def __call__(self, environ, start_response):
        import json as _json

        if environ.get("PATH_INFO") == STATS_PATH:
            with self.lock:
                body = _json.dumps(self.counts).encode()
                if environ["REQUEST_METHOD"] == "DELETE":
                    self.counts = {}
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        kind, n = self.kind(environ)
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + n
            self.counts["requests"] = self.counts.get("requests", 0) + 1
        if self.latency_s:
            time.sleep(self.latency_s)
        return self.app(environ, start_response)


def _moto_server(latency_s: float):
    """moto's threaded server on 127.0.0.1:<free port>, behind ``_Throttle``."""
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, ThreadedMotoServer, create_backend_app
    from werkzeug.serving import make_server

    class Server(ThreadedMotoServer):
        def _server_entry(self) -> None:
            app = _Throttle(DomainDispatcherApplication(create_backend_app), latency_s)
            self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    return Server(ip_address=HOST, port=0, verbose=False)


def _create_bucket(endpoint_url: str, bucket: str) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name=REGION,
    )
    try:
        client.create_bucket(Bucket=bucket)
    finally:
        client.close()


class S3Server:
    """moto's S3 server on 127.0.0.1:<kernel-chosen port>.

    ``mode="thread"`` (default) runs it in a daemon thread of this process
    (about 1 s to start); ``mode="process"`` runs it in a child Python, which
    keeps moto's global state and the GIL out of the test process.
    Use as a context manager or call ``start()``/``stop()``.
    """

    def __init__(self, bucket: str = DEFAULT_BUCKET, mode: str = "thread", start_timeout: float = 60.0, latency_s: float = 0.0):
        if mode not in ("thread", "process"):
            raise ValueError(f"mode must be 'thread' or 'process', not {mode!r}")
        self.bucket = bucket
        self.latency_s = latency_s
        self.mode = mode
        self.start_timeout = start_timeout
        self.endpoint: S3Endpoint | None = None
        self._server = None
        self._proc: subprocess.Popen | None = None

    def start(self) -> S3Endpoint:
        if self.endpoint is not None:
            return self.endpoint
        url = self._start_thread() if self.mode == "thread" else self._start_process()
        try:
            _create_bucket(url, self.bucket)
        except BaseException:
            self.stop()
            raise
        self.endpoint = S3Endpoint(url, self.bucket)
        return self.endpoint

    def _start_thread(self) -> str:
        _quiet_werkzeug()
        self._server = _moto_server(self.latency_s)
        self._server.start()
        host, port = self._server.get_host_and_port()
        return f"http://{host}:{port}"

    def _start_process(self) -> str:
        # As a module, with the folder that holds zephon_dev first on the child's path: it imports its siblings.
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "zephon_dev.s3_server", "--serve", str(self.latency_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        line = _readline_with_timeout(self._proc, self.start_timeout)
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"moto server child did not report its endpoint (got {line!r})")
        return line.strip()

    def stop(self) -> None:
        self.endpoint = None
        if self._server is not None:
            server, self._server = self._server, None
            server.stop()
        if self._proc is not None:
            proc, self._proc = self._proc, None
            with contextlib.suppress(OSError):
                proc.stdin.close()  # the child exits when stdin closes
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    def stats(self) -> dict[str, int]:
        """Requests served since the start (or the last ``reset_stats``), by kind: get, put, list, delete (per object), head."""
        import json as _json
        import urllib.request

        assert self.endpoint is not None, "start() first"
        with urllib.request.urlopen(self.endpoint.endpoint_url + STATS_PATH, timeout=30) as r:
            return _json.loads(r.read())

    def reset_stats(self) -> None:
        import urllib.request

        assert self.endpoint is not None, "start() first"
        urllib.request.urlopen(urllib.request.Request(self.endpoint.endpoint_url + STATS_PATH, method="DELETE"), timeout=30).close()

    def __enter__(self) -> S3Endpoint:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _readline_with_timeout(proc: subprocess.Popen, timeout: float) -> str:
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return ""
    return proc.stdout.readline()


@contextlib.contextmanager
def start_s3_server(bucket: str = DEFAULT_BUCKET, mode: str = "thread", set_env: bool = True) -> Iterator[S3Endpoint]:
    """Context manager: a running server with ``bucket`` created.

    With ``set_env`` the AWS_* variables of ``s3_env`` are set for the
    duration (and restored afterwards).
    """
    with S3Server(bucket=bucket, mode=mode) as ep:
        undo = apply_env(ep) if set_env else (lambda: None)
        try:
            yield ep
        finally:
            undo()


def soft_barrier(comm, timeout: float) -> bool:
    """MPI barrier that sleeps instead of spinning and gives up after ``timeout``."""
    req = comm.Ibarrier()
    deadline = time.monotonic() + timeout
    while not req.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@contextlib.contextmanager
def shared_s3_server(
    comm,
    bucket: str = DEFAULT_BUCKET,
    mode: str = "thread",
    set_env: bool = True,
    root: int = 0,
    teardown_barrier: Callable[[], bool] | None = None,
    teardown_timeout: float = 60.0,
) -> Iterator[S3Endpoint]:
    """One server for all ranks of ``comm`` (an mpi4py communicator).

    Collective: every rank must enter it. ``root`` starts the server and
    broadcasts the endpoint (or its start-up error, re-raised on every rank).
    On exit the ranks wait for each other (at most ``teardown_timeout`` s,
    without spinning) before ``root`` stops the server; pass
    ``teardown_barrier=lambda: False`` to skip the wait (e.g. after a failure,
    when the other ranks may never arrive).
    """
    server = None
    payload: Any
    if comm.rank == root:
        server = S3Server(bucket=bucket, mode=mode)
        try:
            payload = server.start()
        except Exception as exc:  # report to the other ranks instead of hanging them
            payload = RuntimeError(f"rank {root} could not start the S3 server: {exc!r}")
    else:
        payload = None
    payload = comm.bcast(payload, root=root)
    if isinstance(payload, BaseException):
        raise payload
    ep: S3Endpoint = payload
    undo = apply_env(ep) if set_env else (lambda: None)
    try:
        yield ep
    finally:
        undo()
        if teardown_barrier is None:
            soft_barrier(comm, teardown_timeout)
        else:
            teardown_barrier()
        if server is not None:
            server.stop()


def _serve_forever(latency_s: float = 0.0) -> int:
    _quiet_werkzeug()
    server = _moto_server(latency_s)
    server.start()
    host, port = server.get_host_and_port()
    print(f"http://{host}:{port}", flush=True)
    try:
        sys.stdin.read()  # until the parent closes our stdin (or dies)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        raise SystemExit(_serve_forever(float(sys.argv[2]) if len(sys.argv) > 2 else 0.0))
    print(__doc__)
    raise SystemExit(2)
