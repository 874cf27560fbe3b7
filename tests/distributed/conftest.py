"""Fixtures for multi-rank tests (pytest-mpi + torch.distributed gloo on CPU).

Run with ``scripts/run_mpi_matrix.sh`` (N = 1, 2, 4, 8), or by hand:

    $ZEPHON_VENV/bin/mpiexec -n 4 $ZEPHON_PY -m mpi4py -m pytest tests/distributed \
        --only-mpi -x -p no:cacheprovider --timeout=300 --timeout-method=thread

Every rank runs the whole session, so every rank must take the same skip
decisions and issue the same collectives in the same order. Mark tests
``@pytest.mark.mpi`` (any size) or ``@pytest.mark.mpi(min_size=2)``; without
``--with-mpi``/``--only-mpi`` (a plain serial ``pytest tests``) they are
skipped, and nothing here imports mpi4py or torch at collection time.

Fixtures:
  mpi_comm      session   mpi4py ``MPI.COMM_WORLD`` (checked against the launcher's size)
  rank          function  ``mpi_comm.rank``
  world_size    function  ``mpi_comm.size``
  gloo_pg       function  a fresh default gloo process group over all ranks (60 s
                          timeout), yields ``dist.group.WORLD``, destroyed after the test;
                          also sets RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT
  dist_env      function  only the env:// variables (MASTER_PORT = a free port picked by
                          rank 0), for code under test that calls init_process_group itself;
                          any group left initialised is destroyed after the test
  shared_tmp    function  a ``pathlib.Path`` that is the same fresh directory on all ranks
  barrier       function  ``barrier()``: gloo barrier if a default group exists, else a
                          non-spinning MPI barrier
  allgather     function  ``allgather(obj) -> list`` of every rank's ``obj`` (rank order)
  s3_endpoint   session   overrides tests/conftest.py: rank 0 runs the one moto S3
                          server and all ranks get the same endpoint/env
"""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

import pytest

PG_TIMEOUT = timedelta(seconds=60)
LOOPBACK = "127.0.0.1"

# Hydra (MPICH) sets PMI_SIZE, Open MPI sets OMPI_COMM_WORLD_SIZE.
_LAUNCHER_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")


def _launcher_size() -> tuple[str, int] | None:
    for name in _LAUNCHER_SIZE_VARS:
        value = os.environ.get(name)
        if value and value.isdigit():
            return name, int(value)
    return None


def _check_world(comm) -> None:
    found = _launcher_size()
    if found is not None and found[1] != comm.size:
        pytest.exit(
            f"MPI launcher/library mismatch: {found[0]}={found[1]} but "
            f"MPI.COMM_WORLD.size={comm.size} (mpi4py loaded {_mpi_library()!r}); "
            f"launch with the venv's own mpiexec",
            returncode=3,
        )


def _mpi_library() -> str:
    from mpi4py import MPI

    return MPI.Get_library_version().splitlines()[0].strip()


def _mpi_mode(config) -> bool:
    return bool(config.getoption("only_mpi", False) or config.getoption("with_mpi", False))


def pytest_sessionstart(session):
    # Catch a mismatched launcher before any test runs, even tests that
    # never ask for mpi_comm (they would otherwise "pass" as N size-1 jobs).
    if _mpi_mode(session.config):
        from mpi4py import MPI

        _check_world(MPI.COMM_WORLD)


def _bcast_or_raise(comm, value, root: int = 0):
    """bcast that turns a root-side exception into an error on every rank."""
    value = comm.bcast(value, root=root)
    if isinstance(value, BaseException):
        raise RuntimeError(f"rank {root} failed: {value!r}") from (value if comm.rank == root else None)
    return value


@pytest.fixture(scope="session")
def mpi_comm():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    _check_world(comm)
    return comm


@pytest.fixture
def rank(mpi_comm) -> int:
    return mpi_comm.rank


@pytest.fixture
def world_size(mpi_comm) -> int:
    return mpi_comm.size


def _set_dist_env(mp: pytest.MonkeyPatch, comm, port: int) -> None:
    for name, value in {
        "MASTER_ADDR": LOOPBACK,
        "MASTER_PORT": str(port),
        "RANK": str(comm.rank),
        "WORLD_SIZE": str(comm.size),
        "LOCAL_RANK": str(comm.rank),
        "LOCAL_WORLD_SIZE": str(comm.size),
    }.items():
        mp.setenv(name, value)


def _destroy_leftover_group() -> None:
    if "torch.distributed" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def gloo_pg(mpi_comm):
    import torch.distributed as dist

    _destroy_leftover_group()
    if mpi_comm.rank == 0:
        try:
            # Port 0: the kernel picks a free port, so nothing can squat on it;
            # wait_for_workers=False: otherwise the constructor blocks before
            # the port can be broadcast.
            store = dist.TCPStore(
                LOOPBACK, 0, mpi_comm.size, is_master=True, wait_for_workers=False, timeout=PG_TIMEOUT
            )
            port = store.port
        except Exception as exc:
            port = exc
        port = _bcast_or_raise(mpi_comm, port)
    else:
        port = _bcast_or_raise(mpi_comm, None)
        store = dist.TCPStore(LOOPBACK, port, mpi_comm.size, is_master=False, timeout=PG_TIMEOUT)
    dist.init_process_group(
        "gloo", store=store, rank=mpi_comm.rank, world_size=mpi_comm.size, timeout=PG_TIMEOUT
    )
    with pytest.MonkeyPatch.context() as mp:
        _set_dist_env(mp, mpi_comm, port)
        try:
            yield dist.group.WORLD
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            del store


@pytest.fixture
def dist_env(mpi_comm):
    _destroy_leftover_group()
    port = None
    if mpi_comm.rank == 0:
        try:
            # Small race window (the port is free again until the code under
            # test binds it), which is why gloo_pg keeps its store instead.
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((LOOPBACK, 0))
                port = s.getsockname()[1]
        except Exception as exc:
            port = exc
    port = _bcast_or_raise(mpi_comm, port)
    with pytest.MonkeyPatch.context() as mp:
        _set_dist_env(mp, mpi_comm, port)
        try:
            yield {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
        finally:
            _destroy_leftover_group()


@pytest.fixture
def shared_tmp(mpi_comm, tmp_path_factory) -> Path:
    path = None
    if mpi_comm.rank == 0:
        try:
            path = str(tmp_path_factory.mktemp("shared"))
        except Exception as exc:
            path = exc
    path = Path(_bcast_or_raise(mpi_comm, path))
    assert path.is_dir(), f"rank {mpi_comm.rank} cannot see the shared directory {path}"
    return path


def _default_group_ready() -> bool:
    if "torch.distributed" not in sys.modules:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


@pytest.fixture
def barrier(mpi_comm):
    from zephon_dev import s3_server
    def _barrier(timeout: float = 60.0) -> None:
        if _default_group_ready():
            import torch.distributed as dist

            dist.barrier()
        elif not s3_server.soft_barrier(mpi_comm, timeout):
            raise TimeoutError(f"rank {mpi_comm.rank}: barrier not reached by all ranks in {timeout} s")

    return _barrier


@pytest.fixture
def allgather(mpi_comm):
    def _allgather(obj) -> list:
        if _default_group_ready():
            import torch.distributed as dist

            out = [None] * dist.get_world_size()
            dist.all_gather_object(out, obj)
            return out
        return mpi_comm.allgather(obj)

    return _allgather


@pytest.fixture(scope="session")
def s3_endpoint(mpi_comm, request):
    from zephon_dev import s3_server
    def teardown_barrier() -> bool:
        # After a failure some ranks may never get here (-x); don't wait for them.
        if request.session.testsfailed:
            return False
        return s3_server.soft_barrier(mpi_comm, 60.0)

    mode = os.environ.get("ZEPHON_TEST_S3_MODE", "thread")
    with s3_server.shared_s3_server(
        mpi_comm, mode=mode, set_env=False, teardown_barrier=teardown_barrier
    ) as ep, pytest.MonkeyPatch.context() as mp:
        for name, value in s3_server.s3_env(ep).items():
            if value:
                mp.setenv(name, value)
            else:
                mp.delenv(name, raising=False)
        yield ep
