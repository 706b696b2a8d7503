"""Fixtures of the MPI tests (run under mpiexec, every rank the same test)."""

import shutil
import tempfile
from pathlib import Path

import pytest
from mpi4py import MPI


@pytest.fixture
def folder():
    """A folder every rank sees (made by rank 0, removed by it once every rank is done)."""
    comm = MPI.COMM_WORLD
    path = comm.bcast(tempfile.mkdtemp(prefix="fednest-mpi-test-") if comm.rank == 0 else None, root=0)
    yield Path(path)
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
