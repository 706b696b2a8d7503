"""The problem plugin of examples/ridge_tuning: its closed-form oracles and per-client values against autograd,
and a FedNest run through runner.simulate that tunes the penalties better than one penalty for all, the plugin
named in the config as 'fednest_ridge_tuning:RidgeTuning' (its folder on sys.path; installed, its entry point
names it 'ridge_tuning')."""

import sys
from pathlib import Path

import torch
from oracle_check import assert_oracles_match_autograd

from fednest_mpi import config
from fednest_mpi.comm import SerialComm
from fednest_mpi.runner import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "ridge_tuning"))
from fednest_ridge_tuning import RidgeTuning  # noqa: E402

PLUGIN = "fednest_ridge_tuning:RidgeTuning"


def test_oracles_and_values_match_autograd():
    cfg = RidgeTuning.Params(n_clients=8, dim=6, informative=2, train_samples=4, val_samples=3)
    prob = RidgeTuning(cfg, 1, range(2, 7))

    def f_g(i, x, y):
        row = i - 2
        f = 0.5 * ((prob.va[row] @ y - prob.vb[row]) ** 2).mean()
        g = 0.5 * ((prob.a[row] @ y - prob.b[row]) ** 2).mean() + 0.5 * (torch.exp(x) * y * y).sum()
        return f, g

    assert_oracles_match_autograd(prob, [2, 4, 6], f_g)


def test_tuned_penalties_beat_one_penalty_for_all():
    def run(outer_lr):
        data = {
            "seed": 0,
            "problem": {"name": PLUGIN, "n_clients": 20},
            "algorithm": {
                "name": "fednest",
                "outer_iterations": 10,
                "clients_per_round": 5,
                "inner_lr": 0.1,
                "inner_local_steps": 10,
                "outer_lr": outer_lr,
                "neumann_steps": 10,
                "neumann_scale": 0.1,
            },
            "run": {"output": "unused.h5"},
        }
        return simulate(config.from_dict(data), SerialComm()).history["test_loss"]

    tuned, fixed = run(10.0), run(1e-9)
    assert tuned[0] == fixed[0]
    assert tuned[-1] < 0.5 * fixed[-1]
