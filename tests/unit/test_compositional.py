"""Compositional problem (paper eq. (2.1), section 3.2, appendix E): oracles, closed forms, and
FedNest with T = 1 converging to the known solution (Corollary 3.3's setting)."""

import numpy as np
import pytest
import torch
from mpi4py import MPI
from oracle_check import assert_oracles_match_autograd

from fednest_mpi import config
from fednest_mpi.algorithms import build_algorithm
from fednest_mpi.errors import ConfigError
from fednest_mpi.federation import Federation
from fednest_mpi.problems import build_problem
from fednest_mpi.runner import simulate


def _config(**algorithm):
    algo = {
        "name": "fednest",
        "outer_iterations": 200,
        "inner_rounds": 1,
        "clients_per_round": 8,
        "inner_lr": 0.5,
        "inner_local_steps": 3,
        "outer_lr": 0.1,
        "outer_local_steps": 1,
        "neumann_steps": 2,
        "neumann_scale": 1.0,
    }
    return config.from_dict(
        {
            "seed": 2,
            "problem": {"name": "compositional", "n_clients": 8, "dim_x": 3, "dim_y": 12, "heterogeneity": 1.0},
            "algorithm": algo | algorithm,
        }
    )


def _problem(cfg, clients=None):
    return build_problem(cfg.problem, cfg.seed, clients or range(cfg.problem.n_clients))


def test_oracles_match_autograd_identity_hessian_and_zero_direct_gradient():
    prob = _problem(_config())
    d = prob._data

    def f_g(i, x, y):
        f = 0.5 * (d["p"][i] * (y - d["a"][i])) @ (y - d["a"][i]) + 0.0 * x.sum()
        r = d["R"][i] @ x + d["c"][i]
        return f, 0.5 * (y - r) @ (y - r)

    assert_oracles_match_autograd(prob, [0, 5, 7], f_g)


def test_data_do_not_depend_on_placement():
    cfg = _config()
    whole, part = _problem(cfg), _problem(cfg, range(3, 6))
    for k in ("R", "c", "a", "p"):
        torch.testing.assert_close(part._data[k], whole._data[k][3:6], rtol=0, atol=0)
    torch.testing.assert_close(part.x_star, whole.x_star, rtol=0, atol=0)


def test_closed_forms_y_star_hypergradient_and_x_star():
    prob = _problem(_config())
    ids = np.arange(8)
    x = torch.linspace(-1, 2, 3, dtype=torch.float64)
    # y*(x) zeroes the global inner gradient
    y = prob.inner_solution(x)
    grad = prob.grad_y_inner(ids, x.expand(8, -1), y.expand(8, -1), None).mean(0)
    torch.testing.assert_close(grad, torch.zeros(12, dtype=torch.float64), rtol=0, atol=1e-14)
    # eq. (72) is the gradient of f(y*(x)); x* zeroes it and is a minimum
    xr = x.clone().requires_grad_()
    (auto,) = torch.autograd.grad(prob.outer_loss(prob.inner_solution(xr)), xr)
    torch.testing.assert_close(prob.hypergradient(x), auto)
    torch.testing.assert_close(prob.hypergradient(prob.x_star), torch.zeros(3, dtype=torch.float64), rtol=0, atol=1e-12)
    f_star = float(prob.outer_loss(prob.inner_solution(prob.x_star)))
    for direction in torch.eye(3, dtype=torch.float64):
        assert float(prob.outer_loss(prob.inner_solution(prob.x_star + 0.1 * direction))) > f_star
    # the mean of the local outer objectives, written out
    f_mean = np.mean(
        [0.5 * float((prob._data["p"][i] * (y - prob._data["a"][i])) @ (y - prob._data["a"][i])) for i in ids]
    )
    assert float(prob.outer_loss(y)) == pytest.approx(f_mean, rel=1e-12)


def test_fednest_hypergradient_is_exact_at_the_inner_solution():
    """Section 2.4: Hessian = I, so FedIHGP with eta = 1/l_{g,1} = 1 returns p = nabla_y f exactly."""
    cfg = _config()
    fed = Federation(MPI.COMM_SELF, cfg.problem.n_clients)
    prob = build_problem(cfg.problem, cfg.seed, fed.block)
    alg = build_algorithm(cfg.algorithm, prob, fed, cfg.seed)
    x = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64)
    h = alg.hypergradient(0, x, prob.inner_solution(x), alg.sample_clients(2, 0))
    torch.testing.assert_close(h, prob.hypergradient(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("heterogeneity", [0.0, 1.0, 3.0])
def test_fednest_with_one_inner_round_converges_to_the_solution(heterogeneity):
    cfg = _config()
    cfg = config.from_dict(cfg.to_dict() | {"problem": cfg.to_dict()["problem"] | {"heterogeneity": heterogeneity}})
    result = simulate(cfg, MPI.COMM_SELF)
    err = np.array(result.history["x_error"])
    assert err[0] > 0.1
    assert err[-1] < 1e-10 * err[0]
    assert result.history["y_error"][-1] < 1e-9


def test_config_requires_dim_y_at_least_dim_x():
    with pytest.raises(ConfigError, match="problem.dim_y"):
        config.from_dict(
            {"problem": {"name": "compositional", "dim_x": 4, "dim_y": 3}, "algorithm": {"clients_per_round": 5}}
        )
