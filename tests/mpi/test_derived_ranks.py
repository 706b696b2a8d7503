"""Derived oracles (problems/derived.py, problems/models.py) under chunking and ranks: with
``federation.reduction = "ordered"`` a run of hyper-representation and loss tuning over the derived
oracles (float32, clients of different sizes) is bitwise the same for chunk sizes 1 and "all" (0)
and for any number of ranks, as the closed forms' runs are (docs/extending.md). Run under ``mpiexec -n 1``,
``-n 2`` and ``-n 4``. The derived quadratic plugin is checked by test_chunking.py's registry-wide test."""

import pytest
import torch
from histories import assert_histories_match
from mpi4py import MPI
from one_rank import simulate_on_one_rank
from shared_data import DATA, requires

from fednest_mpi import config
from fednest_mpi.runner import simulate

PROBLEMS = {
    "hyperrep": {  # 200 clients: ~300 images each (the 20 of loss tuning hold ~100)
        "name": "hyper_representation",
        "partition": "dirichlet",
        "dirichlet_alpha": 0.3,
        "hidden": 8,
        "n_clients": 200,
    },
    "loss_tuning": {"name": "loss_tuning", "hidden1": 12, "hidden2": 8, "max_per_class": 300},
}


def _config(problem: str, name: str, chunk: int) -> config.RunConfig:
    return config.from_dict(
        {
            "seed": 5,
            "problem": {"data_dir": str(DATA), "n_clients": 20, "batch_size": 4, "derived_oracles": True}
            | PROBLEMS[problem],
            "algorithm": config.algorithm_fields(
                name,
                {
                    "name": name,
                    "outer_iterations": 2,
                    "clients_per_round": 9,
                    "inner_local_steps": 3,
                    "neumann_steps": 2,
                    "inner_lr": 0.05,
                    "outer_lr": 0.05,
                },
            ),
            "federation": {"reduction": "ordered"},
            "run": {"chunk_clients": chunk, "dtype": "float32"},
        }
    )


@pytest.mark.mpi
@pytest.mark.problem_invariance
@requires("mnist")
@pytest.mark.parametrize("problem, name", [("hyperrep", "fednest"), ("loss_tuning", "fedbioacc")])
def test_derived_runs_are_bitwise_the_same_for_every_chunk_size_and_rank_count(problem, name):
    """FedNest (FedInn's local steps at the shared x, FedIHGP) and FedBiOAcc (empty blocks, per-client y)."""
    reference = simulate_on_one_rank(_config(problem, name, 0))
    for chunk in (1, 0):
        run = simulate(_config(problem, name, chunk), MPI.COMM_WORLD)
        assert_histories_match(run.history, reference.history)
        assert torch.equal(run.x, reference.x) and torch.equal(run.y, reference.y)
