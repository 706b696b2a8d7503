"""Fair FL on UCI Adult, cell-balanced and pooled worst-group outer loss (one extra FedOut round pools
the group or (group, label) cell losses of the round's clients): 1 rank (COMM_SELF) versus every rank of
COMM_WORLD, with
client sampling. Run under ``mpiexec -n 1``, ``-n 2`` and ``-n 4`` (``make test-mpi``)."""

import pytest
import torch
from histories import assert_histories_match
from mpi4py import MPI
from one_rank import simulate_on_one_rank
from shared_data import requires, small_fairness_config

from fednest_mpi.runner import simulate

pytestmark = requires("adult")


@pytest.mark.mpi
@pytest.mark.problem_invariance
@pytest.mark.parametrize("reduction", ["ordered", "sum"])
@pytest.mark.parametrize(
    "objective, cells", [("balanced", "group"), ("worst_group", "group"), ("worst_group", "group_label")]
)
def test_fairness_run_is_the_same_on_any_number_of_ranks(reduction, objective, cells):
    cfg = small_fairness_config(objective=objective, cells=cells, reduction=reduction)
    world, single = simulate(cfg, MPI.COMM_WORLD), simulate_on_one_rank(cfg)
    if reduction == "ordered":  # FedNest's oracles give a client the same bits in any block: bitwise
        assert_histories_match(world.history, single.history)
        assert torch.equal(world.x, single.x) and torch.equal(world.y, single.y)
    else:
        assert_histories_match(world.history, single.history, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(world.x, single.x, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(world.y, single.y, rtol=1e-10, atol=1e-12)
    assert torch.count_nonzero(single.x) > 0  # the weights moved
