"""The training-set metrics (run.train_eval_every) of an N-rank run equal the 1-rank run's."""

import numpy as np
import pytest
from mpi4py import MPI
from one_rank import simulate_on_one_rank
from shared_data import DATA, requires

from fednest_mpi import config
from fednest_mpi.runner import simulate


@pytest.mark.mpi
@pytest.mark.problem_invariance
@requires("mnist")
def test_training_metrics_do_not_depend_on_the_rank_count():
    cfg = config.from_dict(
        {
            "problem": {
                "name": "hyper_representation",
                "data_dir": str(DATA),
                "n_clients": 12,
                "hidden": 5,
                "batch_size": 16,
            },
            "algorithm": {"outer_iterations": 2, "clients_per_round": 4, "inner_local_steps": 2},
            "run": {"dtype": "float64", "train_eval_every": 1, "client_series": False, "output": "unused.h5"},
        }
    )
    world = simulate(cfg, MPI.COMM_WORLD).history
    single = simulate_on_one_rank(cfg).history
    for name in ("outer_loss", "inner_loss", "train_accuracy"):
        np.testing.assert_allclose(world[name], single[name], rtol=1e-12, err_msg=name)


@pytest.mark.mpi
@pytest.mark.problem_invariance
@requires("mnist")
def test_with_the_ordered_reduction_the_training_metrics_are_bitwise_the_same_on_any_rank_count():
    cfg = config.from_dict(
        {
            "problem": {
                "name": "loss_tuning",
                "data_dir": str(DATA),
                "n_clients": 30,
                "hidden1": 12,
                "hidden2": 0,
                "max_per_class": 300,
                "batch_size": 8,
                "tune_loss": False,
            },
            "algorithm": {"name": "fedavg", "outer_iterations": 2, "clients_per_round": 5, "inner_local_steps": 3},
            "federation": {"reduction": "ordered"},
            "run": {"dtype": "float64", "train_eval_every": 1, "client_series": False, "output": "unused.h5"},
        }
    )
    world = simulate(cfg, MPI.COMM_WORLD).history
    single = simulate_on_one_rank(cfg).history
    for name in ("outer_loss", "inner_loss", "train_accuracy"):
        np.testing.assert_array_equal(world[name], single[name], err_msg=name)
