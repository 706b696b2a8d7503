"""Closed forms and oracles of the quadratic problem, checked against autograd and linear algebra."""

import numpy as np
import torch

from fednest_mpi import rng
from fednest_mpi.problems import build_problem
from fednest_mpi.problems.base import Sample


def _problem(cfg, clients=None):
    return build_problem(cfg.problem, cfg.seed, clients or range(cfg.problem.n_clients))


def _f_g(problem, i, x, y):
    """f_i and g_i written out from the data, for autograd."""
    d = {k: problem._data[k][i] for k in "GBcPae"}
    g = 0.5 * y @ d["G"] @ y - y @ (d["B"] @ x + d["c"])
    f = 0.5 * (y - d["a"]) @ d["P"] @ (y - d["a"]) + 0.5 * problem.cfg.outer_regularization * x @ x + d["e"] @ x
    return f, g


def test_oracles_match_autograd(small_config):
    cfg = small_config()
    prob = _problem(cfg)
    ids = np.array([1, 4, 7])
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(3, cfg.problem.dim_x, dtype=torch.float64, generator=gen)
    Y = torch.randn(3, cfg.problem.dim_y, dtype=torch.float64, generator=gen)
    V = torch.randn(3, cfg.problem.dim_y, dtype=torch.float64, generator=gen)
    for b, i in enumerate(ids):
        x = X[b].clone().requires_grad_()
        y = Y[b].clone().requires_grad_()
        f, g = _f_g(prob, i, x, y)
        fx, fy = torch.autograd.grad(f, (x, y))
        (gy,) = torch.autograd.grad(g, y, create_graph=True)
        hvp = torch.autograd.grad(gy @ V[b], y, retain_graph=True)[0]
        jvp = torch.autograd.grad(gy @ V[b], x)[0]
        torch.testing.assert_close(prob.grad_x_outer(ids, X, Y, None)[b], fx)
        torch.testing.assert_close(prob.grad_y_outer(ids, X, Y, None)[b], fy)
        torch.testing.assert_close(prob.grad_y_inner(ids, X, Y, None)[b], gy.detach())
        torch.testing.assert_close(prob.hvp_yy_inner(ids, X, Y, V, None)[b], hvp)
        torch.testing.assert_close(prob.jvp_xy_inner(ids, X, Y, V, None)[b], jvp)


def test_closed_forms(small_config):
    cfg = small_config()
    prob = _problem(cfg)
    M = cfg.problem.n_clients
    all_ids = np.arange(M)
    x = torch.linspace(-1, 1, cfg.problem.dim_x, dtype=torch.float64)
    y_star = prob.inner_solution(x)
    X, Y = x.expand(M, -1), y_star.expand(M, -1)
    # y*(x) zeroes the mean inner gradient
    assert prob.grad_y_inner(all_ids, X, Y, None).mean(0).abs().max() < 1e-12
    # the hypergradient is the gradient of x -> f(x, y*(x)) (autograd through the linear solve)
    xr = x.clone().requires_grad_()
    (auto,) = torch.autograd.grad(prob.outer_objective(xr, prob.inner_solution(xr)), xr)
    torch.testing.assert_close(prob.hypergradient(x), auto)
    # x* is a stationary point
    assert prob.hypergradient(prob.solution()).abs().max() < 1e-10
    # and every global Hessian eigenvalue lies in [mu, L]
    ev = torch.linalg.eigvalsh(prob.global_hessian)
    assert ev.min() >= cfg.problem.strong_convexity - 1e-12 and ev.max() <= cfg.problem.smoothness + 1e-12


def test_clients_are_heterogeneous_and_data_independent_of_block(small_config):
    cfg = small_config()
    whole = _problem(cfg)
    part = _problem(cfg, range(5, 9))
    for name in "GBcPae":
        torch.testing.assert_close(part._data[name], whole._data[name][5:9], rtol=0, atol=0)
    assert (whole._data["G"][0] - whole._data["G"][1]).abs().max() > 1e-2
    assert (whole._data["a"][0] - whole._data["a"][1]).abs().max() > 1e-2
    homogeneous = _problem(small_config(problem={"heterogeneity": 0.0}))
    torch.testing.assert_close(homogeneous._data["G"][0], homogeneous._data["G"][1], rtol=0, atol=0)


def test_gradient_noise_is_unbiased_and_keyed(small_config):
    cfg = small_config(problem={"gradient_noise": 0.5})
    prob = _problem(cfg)
    ids = np.array([2])
    x = torch.zeros(1, cfg.problem.dim_x, dtype=torch.float64)
    y = torch.zeros(1, cfg.problem.dim_y, dtype=torch.float64)
    exact = prob.grad_y_inner(ids, x, y, None)
    a = prob.grad_y_inner(ids, x, y, Sample(rng.key(1), 0))
    assert torch.equal(a, prob.grad_y_inner(ids, x, y, Sample(rng.key(1), 0)))
    assert not torch.equal(a, exact)
    mean = torch.stack([prob.grad_y_inner(ids, x, y, Sample(rng.key(s), 0)) for s in range(4000)]).mean(0)
    assert (mean - exact).abs().max() < 0.05
