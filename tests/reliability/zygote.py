"""A pre-imported parent that forks rank processes on request.

Starting a Python process that imports numpy, fsspec and zephon_core costs
seconds on a busy 2-core machine; forking this single-threaded, already
imported process costs milliseconds. Each rank is still a real, separate
process (its own pid, killed for real by SIGKILL).

Protocol, one JSON object per line on stdin / stdout:

    {"op": "spawn", "cfg": path, "env": {...}, "stderr": path} -> {"pid": N}
    {"op": "wait", "pid": N, "timeout": s}                     -> {"rc": code | null}
    {"op": "exit"}

``rc`` follows ``subprocess``: negative for a signal, null on timeout.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _preload() -> None:
    import fsspec  # noqa: F401
    import fsspec.implementations.local  # noqa: F401
    import numpy  # noqa: F401
    import rank_worker  # noqa: F401
    import relkit  # noqa: F401

    import zephon_core  # noqa: F401
    import zephon_core.checkpoint.aggregate  # noqa: F401

    try:
        import s3fs  # noqa: F401
    except ImportError:
        pass


def _child(cmd: dict) -> None:
    os.environ.clear()
    os.environ.update(cmd["env"])
    fd = os.open(cmd["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.chdir(cmd.get("cwd") or os.getcwd())
    sys.argv = ["rank_worker.py", cmd["cfg"]]
    rc = 1
    try:
        import rank_worker

        rc = rank_worker.main()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        rc = 4
    finally:
        sys.stderr.flush()
        os._exit(rc)


def main() -> None:
    _preload()
    out = sys.stdout
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "spawn":
            pid = os.fork()
            if pid == 0:
                _child(cmd)
            reply: dict = {"pid": pid}
        elif cmd["op"] == "wait":
            deadline = time.monotonic() + cmd["timeout"]
            delay, rc = 0.005, None
            while True:
                done, status = os.waitpid(cmd["pid"], os.WNOHANG)
                if done:
                    rc = os.waitstatus_to_exitcode(status)
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(delay)
                delay = min(delay * 1.5, 0.1)
            reply = {"rc": rc}
        else:
            return
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
