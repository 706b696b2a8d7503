"""problem.data_file: a run on a federated data-set file, each rank reading only its block of
clients, is the same on 1 rank (COMM_SELF) and on every rank of COMM_WORLD, and for any chunk size
(ordered reduction: bitwise).

Run: mpiexec -n 2 python -m pytest -q --only-mpi tests/mpi/test_data_file_ranks.py
"""

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from histories import assert_histories_match
from mpi4py import MPI
from one_rank import simulate_on_one_rank

from fednest_mpi import config
from fednest_mpi.data import convert_arrays
from fednest_mpi.runner import simulate


@pytest.fixture
def data_file():
    comm = MPI.COMM_WORLD
    folder = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None)
    if comm.rank == 0:
        gen = np.random.default_rng(3)
        x, y = gen.normal(size=(1200, 784)).astype(np.float32), gen.integers(0, 10, 1200)
        convert_arrays(x, y, Path(folder) / "own.h5", "dirichlet", 9, seed=2, test=(x[:50], y[:50]))
    comm.Barrier()
    yield str(Path(folder) / "own.h5")
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(folder)


@pytest.mark.mpi
@pytest.mark.problem_invariance
@pytest.mark.parametrize("name,fields", [("hyper_representation", {"hidden": 5}), ("loss_tuning", {"hidden1": 6})])
def test_data_file_run_is_bitwise_rank_and_chunk_invariant(data_file, name, fields):
    def cfg(chunk):
        problem = {"name": name, "data_file": data_file, "n_clients": 9, "batch_size": 8, **fields}
        return config.from_dict(
            {
                "problem": problem,
                "algorithm": {"name": "fednest", "outer_iterations": 3, "clients_per_round": 4},
                "federation": {"reduction": "ordered"},
                "run": {"dtype": "float64", "chunk_clients": chunk},
            }
        )

    world, single = simulate(cfg(0), MPI.COMM_WORLD), simulate_on_one_rank(cfg(3))
    assert_histories_match(world.history, single.history, rtol=None, atol=0)
    assert torch.equal(world.x, single.x) and torch.equal(world.y, single.y)
