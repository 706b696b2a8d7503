"""FedBiO / FedBiOAcc (per-client state on the hosting rank) and FedAvg / FedSVRG: 1 rank (COMM_SELF)
versus every rank of COMM_WORLD, with client sampling, gradient noise and the storm schedule.
Run under ``mpiexec -n 1``, ``-n 2`` and ``-n 4`` (``make test-mpi``)."""

import pytest
import torch
from histories import assert_histories_match
from mpi4py import MPI
from one_rank import simulate_on_one_rank

from fednest_mpi import config
from fednest_mpi.runner import simulate


def _config(small_config, name, reduction):
    return small_config(
        algorithm=config.algorithm_fields(
            name,
            {  # the fields of a union of algorithms that `name` has
                "name": name,
                "outer_iterations": 6,
                "clients_per_round": 5,
                "sync_period": 3,
                "inner_lr": 0.2,
                "outer_lr": 0.1,
                "neumann_steps": 4,
                "neumann_scale": 0.25,
                "step_schedule": "storm",
                "ihgp_mode": "randomized",
                "inner_rounds": 2,
            },
        ),
        problem={"lower_level": "local", "gradient_noise": 0.1},
        federation={"reduction": reduction},
    )


@pytest.mark.mpi
@pytest.mark.parametrize("name", ["fedbio", "fedbioacc", "fedavg", "fedsvrg"])
@pytest.mark.parametrize("reduction", ["ordered", "sum"])
def test_same_run_on_any_number_of_ranks(small_config, name, reduction):
    cfg = _config(small_config, name, reduction)
    world, single = simulate(cfg, MPI.COMM_WORLD), simulate_on_one_rank(cfg)
    assert_histories_match(world.history, single.history, rtol=None if reduction == "ordered" else 1e-12, atol=1e-13)
    if reduction == "ordered":
        assert torch.equal(world.x, single.x) and torch.equal(world.y, single.y)
