"""The training-set metrics (run.train_eval_every) of an N-rank run equal the 1-rank run's."""

import numpy as np
import pytest
from mpi4py import MPI
from shared_data import DATA, requires

from fednest_mpi import config
from fednest_mpi.runner import simulate


@pytest.mark.mpi
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
    single = simulate(cfg, MPI.COMM_SELF).history
    for name in ("outer_loss", "inner_loss", "train_accuracy"):
        np.testing.assert_allclose(world[name], single[name], rtol=1e-12, err_msg=name)
