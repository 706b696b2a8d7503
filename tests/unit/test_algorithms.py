"""FedNest family on the quadratic problem: FedIHGP, hypergradient, Table 2 counts, convergence."""

import numpy as np
import pytest
import torch
from mpi4py import MPI

from fednest_mpi.algorithms import build_algorithm, neumann_series, rounds_per_iteration
from fednest_mpi.federation import Federation
from fednest_mpi.problems import build_problem
from fednest_mpi.runner import simulate

VARIANT_NAMES = ["fednest", "fednest_sgd", "lfednest", "lfednest_svrg", "lfednest_nonalt"]


def _setup(cfg):
    fed = Federation(MPI.COMM_SELF, cfg.problem.n_clients, cfg.federation.reduction)
    prob = build_problem(cfg.problem, cfg.seed, fed.block)
    return prob, fed, build_algorithm(cfg.algorithm, prob, fed, cfg.seed)


def _full_participation(small_config, **algorithm):
    return small_config(algorithm={"clients_per_round": 12, **algorithm})


@pytest.mark.parametrize("n_steps", [0, 3, 8, 20])
def test_fed_ihgp_is_global_inverse_hessian_product_within_neumann_bound(small_config, n_steps):
    cfg = _full_participation(small_config, neumann_steps=n_steps)
    prob, fed, alg = _setup(cfg)
    x = torch.ones(cfg.problem.dim_x, dtype=torch.float64)
    y = torch.zeros(cfg.problem.dim_y, dtype=torch.float64)
    S = alg.sample_clients(1, 0)
    p = alg.fed_ihgp(0, x, y, S)
    ids = np.arange(cfg.problem.n_clients)
    v = prob.grad_y_outer(ids, x.expand(12, -1), y.expand(12, -1), None).mean(0)
    H = prob.global_hessian
    exact = torch.linalg.solve(H, v)
    mu = float(torch.linalg.eigvalsh(H).min())
    eta = cfg.algorithm.neumann_scale
    bound = (1 - eta * mu) ** (n_steps + 1) * float(v.norm()) / mu
    err = float((p - exact).norm())
    assert err <= bound * (1 + 1e-9)
    # the truncation is real (not an exact solve in disguise) ...
    assert err >= 1e-3 * bound
    # ... and it is the global Hessian, not the mean of the local inverses
    local = torch.stack([torch.linalg.solve(prob._data["G"][i], v) for i in ids]).mean(0)
    assert float((local - exact).norm()) > 100 * float(((1 - eta * mu) ** 21) * v.norm() / mu)
    if n_steps == 20:
        assert float((p - local).norm()) > 10 * err


def test_randomized_neumann_has_the_truncated_series_as_expectation():
    gen = torch.Generator().manual_seed(1)
    A = torch.randn(5, 5, dtype=torch.float64, generator=gen)
    H = A @ A.T / 5 + torch.eye(5, dtype=torch.float64)
    v = torch.randn(5, dtype=torch.float64, generator=gen)
    eta, N = 0.2, 6

    def step(n, r, rows=None):
        return r - eta * (H @ r.T).T if r.dim() > 1 else r - eta * H @ r

    draws = [neumann_series(step, v, N, eta, "randomized", n_prime) for n_prime in range(N)]
    torch.testing.assert_close(torch.stack(draws).mean(0), neumann_series(step, v, N - 1, eta, "truncated"))
    # per-row N' (LFedOut): each row stops at its own power
    V = v.expand(3, -1)
    rows = neumann_series(step, V, N, eta, "randomized", torch.tensor([[0], [2], [5]]))
    for b, n_prime in enumerate([0, 2, 5]):
        torch.testing.assert_close(rows[b], draws[n_prime])


def test_hypergradient_is_exact_at_the_inner_solution(small_config):
    cfg = _full_participation(small_config, neumann_steps=80)
    prob, fed, alg = _setup(cfg)
    x = torch.linspace(-2, 1, cfg.problem.dim_x, dtype=torch.float64)
    h = alg.hypergradient(0, x, prob.inner_solution(x), alg.sample_clients(2, 0))
    torch.testing.assert_close(h, prob.hypergradient(x), rtol=1e-10, atol=1e-10)
    # away from y*(x) it is the surrogate of eq. (5) evaluated at y
    y = torch.ones(cfg.problem.dim_y, dtype=torch.float64)
    torch.testing.assert_close(
        alg.hypergradient(0, x, y, alg.sample_clients(2, 0)), prob.hypergradient(x, y), rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize("name", VARIANT_NAMES)
@pytest.mark.parametrize("inner_rounds,neumann_steps", [(1, 5), (2, 3), (3, 0)])
def test_communication_rounds_per_outer_step_match_table_2(small_config, name, inner_rounds, neumann_steps):
    cfg = small_config(
        algorithm={"name": name, "inner_rounds": inner_rounds, "neumann_steps": neumann_steps, "outer_iterations": 3}
    )
    expected = {
        "fednest": 2 * inner_rounds + neumann_steps + 3,
        "fednest_sgd": inner_rounds + neumann_steps + 3,
        "lfednest": inner_rounds + 1,
        "lfednest_svrg": 2 * inner_rounds + 1,
        "lfednest_nonalt": inner_rounds,
    }[name]
    assert rounds_per_iteration(name, inner_rounds, neumann_steps) == expected
    rounds = simulate(cfg, MPI.COMM_SELF).history["comm_rounds"]
    assert np.diff(rounds).tolist() == [expected] * 3


def test_communication_bytes_follow_the_vectors_sent(small_config):
    T, N = 2, 3
    cfg = small_config(algorithm={"inner_rounds": T, "neumann_steps": N, "outer_iterations": 2})
    dx, dy = cfg.problem.dim_x, cfg.problem.dim_y
    per_iteration = 8 * (2 * T * dy + (N + 1) * dy + 2 * dx)  # q, y per FedInn; v, N products; h, x
    assert np.diff(simulate(cfg, MPI.COMM_SELF).history["comm_bytes"]).tolist() == [per_iteration] * 2
    fused = small_config(algorithm={"name": "lfednest_nonalt", "outer_iterations": 2})
    assert np.diff(simulate(fused, MPI.COMM_SELF).history["comm_bytes"]).tolist() == [8 * (dx + dy)] * 2


def test_randomized_ihgp_uses_at_most_n_minus_one_product_rounds(small_config):
    T, N = 1, 6
    cfg = small_config(algorithm={"ihgp_mode": "randomized", "neumann_steps": N, "outer_iterations": 30})
    per_step = np.diff(simulate(cfg, MPI.COMM_SELF).history["comm_rounds"]) - (2 * T + 3)
    assert per_step.min() >= 0 and per_step.max() <= N - 1
    assert len(set(per_step.tolist())) > 2  # N' really is drawn


def _final_errors(small_config, name, **algorithm):
    cfg = small_config(
        problem={"n_clients": 20, "heterogeneity": 1.0},
        algorithm={
            "name": name,
            "clients_per_round": 20,
            "outer_iterations": 150,
            "inner_local_steps": 20,
            "neumann_steps": 40,
            **algorithm,
        },
    )
    h = simulate(cfg, MPI.COMM_SELF).history
    return h["x_error"][0], h["x_error"][-1], h["x_error"][-20]


def test_fednest_converges_to_the_solution_on_heterogeneous_clients(small_config):
    start, final, earlier = _final_errors(small_config, "fednest")
    assert final < 1e-6 * start
    assert final <= earlier * 1.01  # converged to its Neumann-bias floor, not oscillating


@pytest.mark.parametrize("name", ["lfednest", "lfednest_svrg", "fednest_sgd", "lfednest_nonalt"])
def test_light_and_sgd_variants_stall_at_a_heterogeneity_bias(small_config, name):
    start, final, earlier = _final_errors(small_config, name)
    assert final > 1e-3 * start  # a bias, orders of magnitude above FedNest's error
    assert abs(final - earlier) < 1e-3 * start  # and it is a plateau, not slow convergence


def test_without_heterogeneity_lfednest_converges_too(small_config):
    cfg = small_config(
        problem={"n_clients": 20, "heterogeneity": 0.0},
        algorithm={
            "name": "lfednest",
            "clients_per_round": 20,
            "outer_iterations": 150,
            "neumann_steps": 40,
            "inner_local_steps": 20,
        },
    )
    h = simulate(cfg, MPI.COMM_SELF).history
    assert h["x_error"][-1] < 1e-6 * h["x_error"][0]


def test_partial_participation_with_noise_gets_close(small_config):
    cfg = small_config(
        problem={"n_clients": 40, "gradient_noise": 0.1},
        algorithm={"clients_per_round": 10, "outer_iterations": 120, "inner_local_steps": 20, "neumann_steps": 10},
    )
    h = simulate(cfg, MPI.COMM_SELF).history
    assert min(h["x_error"][-20:]) < 0.25 * h["x_error"][0]
