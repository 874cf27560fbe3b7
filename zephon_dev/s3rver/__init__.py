"""s3rver, a node S3-compatible server, as the bench's second loopback store beside moto (P4).

bench/run.sh installs it once from the pins in this folder (``package.json``, ``package-lock.json``; ``npm ci``)
and applies ``atomic-put.patch`` (a PUT replaces an object at once, as on S3; s3rver writes in place).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from time import perf_counter as perf


class S3rver:
    """s3rver (``script``: its bin/s3rver.js) on 127.0.0.1:<kernel-chosen port>, objects under ``data_dir``.

    A real S3-compatible server (node, its own process), so the P4 numbers on it measure
    the loader's store calls rather than moto's Python CPU cost. Its only credentials are
    S3RVER / S3RVER; paths are bucket/key (no virtual-host buckets on 127.0.0.1).
    """

    KEY = SECRET = "S3RVER"

    def __init__(self, script: str, data_dir: str, bucket: str, start_timeout: float = 60.0) -> None:
        os.makedirs(data_dir, exist_ok=True)
        self.bucket = bucket
        self.log = data_dir.rstrip("/") + "-s3rver.log"  # beside its folder (whose entries are buckets)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                ["node", script, "--directory", data_dir, "--address", "127.0.0.1", "--port", "0", "--silent",
                 "--configure-bucket", bucket],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        # "S3rver listening on 127.0.0.1:<port>" (printed even with --silent)
        deadline = perf() + start_timeout
        while (not (m := re.search(rb"listening on (\S+)\n", open(self.log, "rb").read())) and self.proc.poll() is None
               and perf() < deadline):
            time.sleep(0.05)
        if not m:
            self.stop()
            raise RuntimeError(f"s3rver did not report its address: {open(self.log, 'rb').read()[-500:]!r}")
        self.endpoint_url = "http://" + m.group(1).decode()

    @property
    def storage_options(self) -> dict:
        return {"key": self.KEY, "secret": self.SECRET,
                "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"}}

    def url(self, *parts: str) -> str:
        return "/".join([f"s3://{self.bucket}", *parts])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
