"""Communication is injected: importing the library starts no MPI, and a run on the serial stand-in
equals the same run on MPI's COMM_SELF bitwise."""

import subprocess
import sys

import torch
from histories import assert_histories_match

from fednest_mpi.comm import SerialComm
from fednest_mpi.runner import simulate


def test_importing_the_library_does_not_start_mpi_nor_import_the_writers_packages():
    """Nor tensorboard and mlflow, the extras of fednest_mpi.writers (imported when a writer is built)."""
    code = (
        "import sys\n"
        "import fednest_mpi.algorithms, fednest_mpi.problems, fednest_mpi.runner, fednest_mpi.series\n"
        "import fednest_mpi.post, fednest_mpi.checkpoint, fednest_mpi.federation, fednest_mpi.io.h5\n"
        "import fednest_mpi.api, fednest_mpi.writers, fednest_mpi.session\n"
        "print('mpi4py.MPI' in sys.modules, [m for m in sys.modules if 'tensorboard' in m or 'mlflow' in m])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False []"


def test_a_serial_run_equals_the_comm_self_run(small_config):
    from mpi4py import MPI

    cfg = small_config(algorithm={"name": "fednest", "clients_per_round": 5}, run={"chunk_clients": 2})
    serial, mpi = simulate(cfg, SerialComm()), simulate(cfg, MPI.COMM_SELF)
    assert_histories_match(serial.history, mpi.history)
    assert torch.equal(serial.x, mpi.x) and torch.equal(serial.y, mpi.y)


def test_the_allocator_keeps_freed_memory_on_glibc():
    import platform

    from fednest_mpi.allocator import keep_freed_memory

    if platform.libc_ver()[0] == "glibc":
        assert keep_freed_memory()  # mallopt accepted every setting
