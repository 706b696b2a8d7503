"""Minimax (FedNest eq. (9), LFedNest, FedAvg-S) and compositional runs: 1 rank (COMM_SELF) versus
every rank of COMM_WORLD. Run under ``mpiexec -n 1``, ``-n 2`` and ``-n 4`` (``make test-mpi``)."""

import pytest
import torch
from histories import assert_histories_match
from mpi4py import MPI
from one_rank import simulate_on_one_rank

from fednest_mpi import config
from fednest_mpi.runner import simulate

MINIMAX = {
    "fednest": {"name": "fednest", "hypergradient": "direct"},
    "lfednest": {"name": "lfednest", "ihgp_mode": "randomized"},
    "fedavg_s": {"name": "fedavg_s"},
}


def _minimax(reduction, **algorithm):
    return config.from_dict(
        {
            "seed": 5,
            "problem": {"name": "minimax", "n_clients": 61, "dim": 4, "heterogeneity": 10.0},
            "algorithm": config.algorithm_fields(
                algorithm.get("name", "fednest"),
                {  # the fields the named algorithm has
                    "outer_iterations": 4,
                    "inner_rounds": 2,
                    "clients_per_round": 9,
                    "inner_lr": 0.1,
                    "outer_lr": 0.01,
                    "inner_local_steps": 5,
                    "outer_local_steps": 3,
                    "neumann_steps": 3,
                    "neumann_scale": 0.5,
                }
                | algorithm,
            ),
            "federation": {"reduction": reduction},
        }
    )


def _compositional(reduction):
    return config.from_dict(
        {
            "seed": 5,
            "problem": {"name": "compositional", "n_clients": 13, "dim_x": 3, "dim_y": 6},
            "algorithm": {
                "outer_iterations": 4,
                "clients_per_round": 7,
                "inner_lr": 0.5,
                "inner_local_steps": 3,
                "outer_lr": 0.1,
                "neumann_steps": 2,
                "neumann_scale": 1.0,
            },
            "federation": {"reduction": reduction},
        }
    )


def _check(cfg, exact):
    world, single = simulate(cfg, MPI.COMM_WORLD), simulate_on_one_rank(cfg)
    assert_histories_match(world.history, single.history, rtol=None if exact else 1e-12, atol=1e-13)
    if exact:
        assert torch.equal(world.x, single.x) and torch.equal(world.y, single.y)


@pytest.mark.mpi
@pytest.mark.parametrize("name", list(MINIMAX))
@pytest.mark.parametrize("reduction", ["ordered", "sum"])
def test_minimax_runs_do_not_depend_on_the_rank_count(name, reduction):
    _check(_minimax(reduction, **MINIMAX[name]), exact=reduction == "ordered")


@pytest.mark.mpi
@pytest.mark.parametrize("reduction", ["ordered", "sum"])
def test_compositional_run_does_not_depend_on_the_rank_count(reduction):
    _check(_compositional(reduction), exact=reduction == "ordered")
