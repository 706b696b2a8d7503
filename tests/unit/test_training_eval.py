"""run.train_eval_every: objectives and accuracy on the training data of all clients, every k iterations."""

import math

import numpy as np
import torch
from mpi4py import MPI
from shared_data import DATA, requires

from fednest_mpi import config
from fednest_mpi.runner import Simulation


def _cfg(problem, every=2, iterations=4):
    return config.from_dict(
        {
            "problem": problem,
            "algorithm": {"outer_iterations": iterations, "clients_per_round": 5, "inner_local_steps": 3},
            "run": {"dtype": "float64", "train_eval_every": every, "client_series": False, "output": "unused.h5"},
        }
    )


@requires("mnist")
def test_hyper_representation_training_metrics_equal_a_direct_computation():
    cfg = _cfg({"name": "hyper_representation", "data_dir": str(DATA), "n_clients": 20, "hidden": 6, "batch_size": 16})
    sim = Simulation(cfg, MPI.COMM_SELF)
    assert {"outer_loss", "inner_loss", "train_accuracy"} <= set(sim.columns())
    x, y = sim.problem.initial_point()
    h = sim.run().history
    assert [math.isnan(v) for v in h["train_accuracy"]] == [False, True, False, True, False]
    # iteration 0 by hand: the global model on every client's splits, with torch.nn.functional
    p = sim.problem
    f, g, correct, total = [], [], 0, 0
    for row in range(20):
        inner = torch.as_tensor(p.inner.index[row, : p.inner.count[row]])
        outer = torch.as_tensor(p.outer.index[row, : p.outer.count[row]])
        f.append(float(torch.nn.functional.cross_entropy(p.predict_logits(x, y, p.inputs[outer]), p.targets[outer])))
        logits = p.predict_logits(x, y, p.inputs[inner])
        g.append(
            float(torch.nn.functional.cross_entropy(logits, p.targets[inner]))
            + 0.5 * cfg.problem.inner_regularization * float(y @ y)
        )
        correct += int((logits.argmax(1) == p.targets[inner]).sum())
        total += inner.numel()
    np.testing.assert_allclose([h["outer_loss"][0], h["inner_loss"][0]], [np.mean(f), np.mean(g)], rtol=1e-10)
    assert h["train_accuracy"][0] == 100.0 * correct / total


def test_quadratic_keeps_its_closed_form_objectives_and_has_no_accuracy():
    sim = Simulation(_cfg({"name": "quadratic", "n_clients": 12}), MPI.COMM_SELF)
    cols = sim.columns()
    assert "train_accuracy" not in cols
    assert cols["outer_loss"] == sim.problem.metric_info()["outer_loss"]  # the problem's own closed form wins
    h = sim.run().history
    assert all(math.isfinite(v) for v in h["outer_loss"])


def test_off_by_default():
    cfg = config.from_dict(
        {
            "problem": {"name": "quadratic", "n_clients": 12},
            "algorithm": {"outer_iterations": 1, "clients_per_round": 4},
        }
    )
    assert cfg.run.train_eval_every == 0
