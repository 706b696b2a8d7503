"""Single-level FedAvg and FedSVRG (FedNest section 3.3) on g(x0, .) of the heterogeneous quadratic:
FedSVRG reaches the exact minimiser, FedAvg the closed-form fixed point of its client drift."""

import pytest
import torch
from mpi4py import MPI

from fednest_mpi.problems import build_problem
from fednest_mpi.runner import simulate

TAU, BETA = 5, 0.2


def _config(small_config, name, **problem):
    return small_config(
        algorithm={
            "name": name,
            "clients_per_round": 12,
            "inner_local_steps": TAU,
            "inner_lr": BETA,
            "outer_iterations": 60,
        },
        problem=problem,
    )


def _fedavg_fixed_point(prob, x):
    """y = mean_i [A_i y + b_i] with A_i = (I - beta G_i)^tau, b_i = sum_{j<tau} (I - beta G_i)^j beta (B_i x + c_i)."""
    G, B, c = prob._data["G"], prob._data["B"], prob._data["c"]
    eye = torch.eye(prob.dim_y, dtype=torch.float64)
    step = eye - BETA * G
    A = torch.linalg.matrix_power(step, TAU)
    d = BETA * (torch.einsum("bij,j->bi", B, x) + c)
    b = sum(torch.einsum("bij,bj->bi", torch.linalg.matrix_power(step, j), d) for j in range(TAU))
    return torch.linalg.solve(eye - A.mean(0), b.mean(0))


def test_fedsvrg_reaches_the_exact_minimiser_and_fedavg_stalls_at_its_drift_bias(small_config):
    runs = {name: simulate(_config(small_config, name), MPI.COMM_SELF) for name in ("fedavg", "fedsvrg")}
    cfg = _config(small_config, "fedavg")
    prob = build_problem(cfg.problem, cfg.seed, range(12))
    x0, _ = prob.initial_point()
    y_star = prob.inner_solution(x0)
    for run in runs.values():
        assert torch.equal(run.x, x0)  # x never moves
    assert float((runs["fedsvrg"].y - y_star).norm()) < 1e-10
    y_fedavg = _fedavg_fixed_point(prob, x0)
    assert float((runs["fedavg"].y - y_fedavg).norm()) < 1e-10
    assert float((y_fedavg - y_star).norm()) > 1e-2  # the drift bias is real
    assert runs["fedavg"].history["y_error"][-1] > 1e-2
    # identical clients: no drift, FedAvg is exact too
    same = simulate(_config(small_config, "fedavg", heterogeneity=0.0), MPI.COMM_SELF)
    assert same.history["y_error"][-1] < 1e-10


@pytest.mark.parametrize("name, per_round", [("fedavg", 1), ("fedsvrg", 2)])
def test_rounds_and_oracles_per_iteration(small_config, name, per_round):
    cfg = small_config(
        algorithm={
            "name": name,
            "inner_rounds": 3,
            "outer_iterations": 2,
            "clients_per_round": 4,
            "inner_local_steps": TAU,
        }
    )
    h = simulate(cfg, MPI.COMM_SELF).history
    assert h["comm_rounds"][-1] == 2 * 3 * per_round
    calls = 2 * 3 * 4 * (TAU * per_round + (1 if per_round == 2 else 0))
    assert h["oracle_grad_y_inner"][-1] == calls
    assert h["oracle_grad_x_outer"][-1] == h["oracle_hvp_yy_inner"][-1] == 0
