"""Data hyper-cleaning (problems/hyper_cleaning.py) gives the same run on 1 rank (COMM_SELF) and on every
rank of COMM_WORLD, and for any chunk size, with the ordered reduction: bitwise.

Run: mpiexec -n 2 python -m pytest -q --only-mpi tests/mpi/test_hyper_cleaning_ranks.py
"""

import pytest
import torch
from histories import assert_histories_match
from mpi4py import MPI
from one_rank import simulate_on_one_rank
from shared_data import DATA, requires

from fednest_mpi import config
from fednest_mpi.runner import simulate

pytestmark = requires("mnist")


@pytest.mark.mpi
@pytest.mark.problem_invariance
@pytest.mark.parametrize("name", ["fednest", "lfednest"])
def test_run_is_bitwise_rank_and_chunk_invariant(name):
    problem = {
        "name": "hyper_cleaning",
        "data_dir": str(DATA),
        "n_samples": 1500,
        "n_clients": 7,
        "batch_size": 16,
    }
    algorithm = {"name": name, "outer_iterations": 3, "clients_per_round": 5, "outer_lr": 1000.0}

    def cfg(chunk):
        return config.from_dict(
            {
                "problem": {**problem, "partition": "dirichlet"},
                "algorithm": algorithm,
                "federation": {"reduction": "ordered"},
                "run": {"dtype": "float64", "chunk_clients": chunk},
            }
        )

    world = simulate(cfg(0), MPI.COMM_WORLD)
    single = simulate_on_one_rank(cfg(2))
    assert_histories_match(world.history, single.history, rtol=None, atol=0)
    assert torch.equal(world.x, single.x) and torch.equal(world.y, single.y)
    assert world.history["detection_auc"][-1] > 0.5
