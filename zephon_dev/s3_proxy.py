"""A fault and latency proxy in front of the loopback S3 server, owned by the tests and the bench.

``S3Proxy(upstream_url)`` listens on 127.0.0.1 (a kernel-chosen port) and
forwards every request to ``upstream_url``. It can delay every request
(``latency_s``), and fail chosen ones: ``plan(n, method, path, headers)`` is
called for the n-th request (from 0) and returns None (forward it) or one of

* ``"500"`` / ``"503"``: an S3 error response (InternalError / SlowDown), not forwarded;
* ``"reset"``: the connection is closed with a TCP reset, nothing answered;
* ``"truncate"``: the upstream response's headers (with its Content-Length) and
  only the first half of its body, then the connection is closed.

It counts requests by method (``counts``), ranged GETs (``range_gets``) and the
faults it injected (``injected``). ``proxy.endpoint(bucket)`` gives S3Endpoint
storage options that go through it.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from zephon_dev.s3_server import HOST, S3Endpoint

Plan = Callable[[int, str, str, dict[str, str]], str | None]

_ERRORS = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "SlowDown", "Please reduce your request rate."),
}


class S3Proxy:
    def __init__(self, upstream_url: str, *, latency_s: float = 0.0, plan: Plan | None = None) -> None:
        up = urlsplit(upstream_url)
        self.upstream = (up.hostname or HOST, up.port or 80)
        self.latency_s = latency_s
        self.plan = plan
        self.counts: Counter[str] = Counter()
        self.range_gets = 0
        self.injected: Counter[str] = Counter()
        self._n = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((HOST, 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-proxy", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def endpoint(self, bucket: str) -> S3Endpoint:
        return S3Endpoint(self.url, bucket)

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()
            self.injected.clear()
            self.range_gets = 0

    def __enter__(self) -> S3Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _decide(self, method: str, path: str, headers: dict[str, str]) -> str | None:
        with self._lock:
            n = self._n
            self._n += 1
            self.counts[method] += 1
            if method == "GET" and "range" in {k.lower() for k in headers}:
                self.range_gets += 1
            fault = self.plan(n, method, path, headers) if self.plan else None
            if fault:
                self.injected[fault] += 1
            return fault

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items()}
                fault = proxy._decide(self.command, self.path, headers)
                if proxy.latency_s:
                    time.sleep(proxy.latency_s)
                if fault == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                if fault in _ERRORS:
                    status, code, message = _ERRORS[fault]
                    xml = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(xml)))
                    self.end_headers()
                    self.wfile.write(xml)
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(k, v)
                    # A HEAD answer has no body but the object's length.
                    self.send_header("Content-Length", resp.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data)))
                    self.end_headers()
                    if self.command == "HEAD":
                        return
                    if fault == "truncate" and len(data) > 1:
                        self.wfile.write(data[: len(data) // 2])
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _relay

        return Handler


# Our retries are what a test puts under faults: the store client gets one attempt per request.
NO_CLIENT_RETRIES = {"config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}}}


def through(proxy: S3Proxy, ep: S3Endpoint) -> dict[str, Any]:
    """Storage options for ``ep``'s bucket by way of ``proxy``, with no client retries and a filesystem of their own."""
    so = proxy.endpoint(ep.bucket).storage_options
    so.update(NO_CLIENT_RETRIES)
    so["skip_instance_cache"] = True
    return so


def every(k: int, fault: str, method: str = "GET") -> Plan:
    """A plan failing every k-th request of ``method`` (the 1st, the (k+1)-th, ...) with ``fault``."""
    seen = Counter[str]()

    def plan(n: int, m: str, path: str, headers: dict[str, str]) -> str | None:
        if m != method:
            return None
        seen[m] += 1
        return fault if (seen[m] - 1) % k == 0 else None

    return plan
