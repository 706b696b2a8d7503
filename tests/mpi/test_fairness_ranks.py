"""Fair FL on UCI Adult, cell-balanced and pooled worst-group outer loss (one extra FedOut round pools
the group or (group, label) cell losses of the round's clients): 1 rank (COMM_SELF) versus every rank of
COMM_WORLD, with
client sampling. Run under ``mpiexec -n 1``, ``-n 2`` and ``-n 4`` (``make test-mpi``)."""

import pytest
import torch
from histories import assert_histories_match
from mpi4py import MPI
from shared_data import DATA, requires

from fednest_mpi import config
from fednest_mpi.runner import simulate

pytestmark = requires("adult")


@pytest.mark.mpi
@pytest.mark.parametrize("reduction", ["ordered", "sum"])
@pytest.mark.parametrize(
    "objective, cells", [("balanced", "group"), ("worst_group", "group"), ("worst_group", "group_label")]
)
def test_fairness_run_is_the_same_on_any_number_of_ranks(reduction, objective, cells):
    cfg = config.from_dict(
        {
            "seed": 2,
            "problem": {
                "name": "fairness",
                "n_clients": 8,
                "data_dir": str(DATA),
                "sensitive": "race",
                "val_per_cell": 40,
                "weight_cells": cells,
                "outer_objective": objective,
                "worst_group_temperature": 0.1,
                "hypergradient_batch_size": 64,
            },
            "algorithm": {
                "name": "fednest",
                "outer_iterations": 3,
                "clients_per_round": 5,
                "inner_lr": 0.5,
                "outer_lr": 5.0,
                "neumann_steps": 3,
                "neumann_scale": 0.5,
                "inner_local_steps": 3,
            },
            "federation": {"reduction": reduction},
            "run": {"output": "unused.h5"},
        }
    )
    world, single = simulate(cfg, MPI.COMM_WORLD), simulate(cfg, MPI.COMM_SELF)
    if reduction == "ordered":  # FedNest's oracles give a client the same bits in any block: bitwise
        assert_histories_match(world.history, single.history)
        assert torch.equal(world.x, single.x) and torch.equal(world.y, single.y)
    else:
        assert_histories_match(world.history, single.history, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(world.x, single.x, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(world.y, single.y, rtol=1e-10, atol=1e-12)
    assert torch.count_nonzero(single.x) > 0  # the weights moved
