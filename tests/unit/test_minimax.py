"""Minimax problem (paper eq. (2), section 4.3): data, oracles, closed-form saddle point, and the
behaviour of FedNest's minimax specialisation (eq. (9)), LFedNest and FedAvg-S against closed forms."""

import numpy as np
import pytest
import torch
from mpi4py import MPI
from oracle_check import assert_oracles_match_autograd

from fednest_mpi import config
from fednest_mpi.algorithms import rounds_per_iteration
from fednest_mpi.errors import ConfigError
from fednest_mpi.problems import build_problem
from fednest_mpi.problems.minimax import fednest_sampling_floor
from fednest_mpi.runner import simulate

LAM = 10.0
ALGORITHMS = {  # the three algorithms of Figure 4
    "fednest": {"name": "fednest", "hypergradient": "direct"},
    "lfednest": {"name": "lfednest"},
    "fedavg_s": {"name": "fedavg_s"},
}


STEPS = {  # the step sizes and local steps of the Figure 4 runs
    "inner_lr": 0.1,
    "outer_lr": 0.01,
    "inner_local_steps": 10,
    "outer_local_steps": 10,
    "neumann_steps": 1,
    "neumann_scale": 1.0,
}


def _config(n_clients=100, s=1.0, dim=3, seed=4, heterogeneity=None, **algorithm):
    algo = {"outer_iterations": 40, "clients_per_round": n_clients, **STEPS}
    return config.from_dict(
        {
            "seed": seed,
            "problem": {"name": "minimax", "n_clients": n_clients, "dim": dim, "heterogeneity": s},
            "algorithm": config.algorithm_fields(algorithm.get("name", "fednest"), algo | algorithm),
            "heterogeneity": heterogeneity or {},
        }
    )


def _problem(cfg, clients=None):
    return build_problem(cfg.problem, cfg.seed, clients or range(cfg.problem.n_clients))


def _f(prob, i, x, y):
    t, b = prob._t_local[i, 0], prob._b_local[i]
    return -(0.5 * y @ y - b @ y + t * (y @ x)) + 0.5 * LAM * x @ x


def test_data_are_centred_across_clients_and_independent_of_placement():
    cfg = _config(n_clients=37, s=3.0)
    whole, part = _problem(cfg), _problem(cfg, range(10, 20))
    torch.testing.assert_close(part._b_local, whole._b_local[10:20], rtol=0, atol=0)
    torch.testing.assert_close(part._t_local, whole._t_local[10:20], rtol=0, atol=0)
    assert float(whole._b_local.mean(0).abs().max()) < 1e-14  # b_i = b'_i - mean_j b'_j
    assert float(whole._b_local.std()) > 1.0  # ... of N(0, s^2 I) draws, s = 3
    assert 0.0 <= float(whole._t_local.min()) and float(whole._t_local.max()) < 0.1
    assert whole.t_bar == pytest.approx(float(whole._t_local.mean()), rel=1e-14)


def test_oracles_match_autograd_with_g_equal_to_minus_f():
    prob = _problem(_config(n_clients=9, s=2.0, dim=4))

    def f_g(i, x, y):
        f = _f(prob, i, x, y)
        return f, -f

    assert_oracles_match_autograd(prob, [0, 3, 8], f_g)


def test_closed_form_saddle_point_for_any_data():
    prob = _problem(_config(n_clients=9, s=2.0, dim=4))
    ids = np.arange(9)
    gen = torch.Generator().manual_seed(1)
    prob.b_bar = torch.randn(4, dtype=torch.float64, generator=gen)  # an uncentred instance: x* != 0
    x = torch.randn(4, dtype=torch.float64, generator=gen)
    # y*(x) is the stationary point of the concave y -> f(x, y) = -1/2 ||y||^2 + b_bar^T y - t_bar y^T x + ...
    y = prob.inner_solution(x)
    grad_y = -y + prob.b_bar - prob.t_bar * x
    torch.testing.assert_close(grad_y, torch.zeros(4, dtype=torch.float64), rtol=0, atol=1e-14)
    # x* is the minimiser of F(x) = f(x, y*(x)) (autograd of the objective the run reports)
    x_star, y_star = prob.saddle_point()
    xs = x_star.clone().requires_grad_()
    (grad_F,) = torch.autograd.grad(prob.outer_loss(xs, prob.inner_solution(xs)), xs)
    torch.testing.assert_close(grad_F, torch.zeros(4, dtype=torch.float64), rtol=0, atol=1e-13)
    assert float(x_star.norm()) > 1e-3
    torch.testing.assert_close(y_star, prob.b_bar - prob.t_bar * x_star)
    # the mean of the clients' direct gradients at (x, y*(x)) is that gradient (envelope theorem, eq. (63))
    X = x.expand(9, -1)
    direct = prob.grad_x_outer(ids, X, prob.inner_solution(x).expand(9, -1), None).mean(0)
    xr = x.clone().requires_grad_()
    torch.testing.assert_close(direct, torch.autograd.grad(prob.outer_loss(xr, prob.inner_solution(xr)), xr)[0])


def test_paper_instance_has_its_saddle_point_at_the_origin():
    prob = _problem(_config(n_clients=50, s=10.0))
    assert float(prob.x_star.norm()) < 1e-15 and float(prob.y_star.norm()) < 1e-13


@pytest.mark.parametrize("s", [1.0, 10.0])
def test_fednest_converges_linearly_to_the_saddle_point(s):
    h = simulate(_config(s=s, **ALGORITHMS["fednest"]), MPI.COMM_SELF).history
    x_err, y_err = np.array(h["x_sq_error"]), np.array(h["y_sq_error"])
    assert x_err[0] > 100
    assert x_err[20] < 1e-12 * x_err[0] and x_err[40] < 1e-24 * x_err[0]  # orders of magnitude, every 20 iterations
    assert y_err[40] < 1e-24 * y_err[0]


def test_fednest_floor_under_client_sampling_is_the_sampling_variance_of_b():
    """With |S| < M every round solves the problem of its own sample, so FedNest stalls at the
    closed-form sampling floor of :func:`fednest_sampling_floor` (not at a client-drift bias); the
    time averages of a long run must match it (docs/algorithms.md, "Figure 4")."""
    M, n, burn = 200, 10, 100
    cfg = _config(n_clients=M, s=1.0, dim=5, seed=1, outer_iterations=800, clients_per_round=n, **ALGORITHMS["fednest"])
    var_y, var_x = fednest_sampling_floor(_problem(cfg), cfg.algorithm)
    h = simulate(cfg, MPI.COMM_SELF).history
    assert np.mean(h["y_sq_error"][burn:]) == pytest.approx(var_y, rel=0.1)
    assert np.mean(h["x_sq_error"][burn:]) == pytest.approx(var_x, rel=0.1)
    assert var_x > 1e-8  # a floor, far above the rounding level full participation reaches


def _lfednest_fixed_point(prob, cfg):
    """LFedOut with exact local inverse Hessians (eta = 1, H_i = I): h_i = (lambda + t_i^2) x_i - t_i b_i,
    so tau local steps give x_i = rho_i^tau x + (1 - rho_i^tau) u_i; the averaged map's fixed point."""
    t, b = prob._t_local, prob._b_local
    rho = (1 - cfg.algorithm.outer_lr * (LAM + t**2)) ** cfg.algorithm.outer_local_steps
    u = t * b / (LAM + t**2)
    return ((1 - rho) * u).mean(0) / (1 - rho).mean()


def _fedavg_s_fixed_point(prob, cfg):
    """Per coordinate the local step is z <- M_i z + c_i, M_i = [[1 - a lam, a t_i], [-b t_i, 1 - b]],
    c_i = [0, b b_i]; tau steps and the average give z <- A z + C, fixed point (I - A)^-1 C."""
    a, beta, tau = cfg.algorithm.outer_lr, cfg.algorithm.inner_lr, cfg.algorithm.inner_local_steps
    t, b = prob._t_local[:, 0].numpy(), prob._b_local.numpy()
    A, C = np.zeros((2, 2)), np.zeros((2, b.shape[1]))
    for ti, bi in zip(t, b):
        M = np.array([[1 - a * LAM, a * ti], [-beta * ti, 1 - beta]])
        c = np.vstack([np.zeros_like(bi), beta * bi])
        power, acc = np.eye(2), np.zeros_like(c)
        for _ in range(tau):
            acc += power @ c
            power = M @ power
        A += power / len(t)
        C += acc / len(t)
    z = np.linalg.solve(np.eye(2) - A, C)
    return torch.as_tensor(z[0]), torch.as_tensor(z[1])


@pytest.mark.parametrize("name", ["lfednest", "fedavg_s"])
def test_lfednest_and_fedavg_s_stall_at_their_closed_form_s_dependent_points(name):
    plateaus = []
    for s in (1.0, 10.0):
        cfg = _config(s=s, outer_iterations=80, **ALGORITHMS[name])
        prob = _problem(cfg)
        result = simulate(cfg, MPI.COMM_SELF)
        if name == "lfednest":
            x_fix = _lfednest_fixed_point(prob, cfg)
        else:
            x_fix, y_fix = _fedavg_s_fixed_point(prob, cfg)
            torch.testing.assert_close(result.y, y_fix, rtol=1e-9, atol=1e-15)
        torch.testing.assert_close(result.x, x_fix, rtol=1e-9, atol=1e-15)
        err = np.array(result.history["x_sq_error"])
        assert err[80] > 0.5 * err[40]  # a plateau, not a slow descent
        plateaus.append(float((x_fix - prob.x_star).norm() ** 2))
    assert plateaus[0] > 1e-12  # biased away from x* ...
    assert plateaus[1] / plateaus[0] == pytest.approx(100.0, rel=1e-6)  # ... by an error proportional to s^2


@pytest.mark.parametrize("name,expected", [("fednest", 2 * 2 + 2), ("lfednest", 2 + 1), ("fedavg_s", 1)])
def test_communication_rounds_per_iteration(name, expected):
    cfg = _config(outer_iterations=3, inner_rounds=2, **ALGORITHMS[name])
    assert np.diff(simulate(cfg, MPI.COMM_SELF).history["comm_rounds"]).tolist() == [expected] * 3
    if name != "fedavg_s":
        assert rounds_per_iteration(name, 2, cfg.algorithm.neumann_steps, cfg.algorithm.hypergradient) == expected


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_paper_scale_1000_clients_50_per_round_runs(name):
    cfg = config.from_dict(
        {
            "problem": {"name": "minimax", "n_clients": 1000, "heterogeneity": 10.0},
            "algorithm": config.algorithm_fields(
                name,
                {"outer_iterations": 5, "clients_per_round": 50, **STEPS} | ALGORITHMS[name],
            ),
        }
    )
    err = simulate(cfg, MPI.COMM_SELF).history["x_sq_error"]
    assert err[0] == pytest.approx(1000.0) and err[-1] < 1e-2 * err[0]


def test_config_rejects_minimax_only_choices_on_other_problems(small_config):
    with pytest.raises(ConfigError, match="algorithm.hypergradient"):
        small_config(algorithm={"hypergradient": "direct"})
    with pytest.raises(ConfigError, match="algorithm.name: 'fedavg_s'"):
        small_config(algorithm={"name": "fedavg_s"})


DRIFT = {"local_work": "uniform", "local_work_min": 0.1}  # client i: tau_i ~ U{1..10} local steps (Fig. 4 preset)
FIG4 = {  # jobs/sweeps/fig4.toml: LFedNest with Algorithm 5's minimax line, as FedNest's eq. (9)
    "fednest": {"name": "fednest", "hypergradient": "direct"},
    "lfednest": {"name": "lfednest", "hypergradient": "direct"},
    "fedavg_s": {"name": "fedavg_s"},
}


@pytest.mark.parametrize("seed", [5, 6])
def test_fig4_client_drift_puts_fednest_ahead_of_lfednest_and_lfednest_below_fedavg_s(seed):
    """Figure 4's two messages at full participation. Without drift (equal local work) LFedNest's local
    steps average to FedNest's (every client's Hessians are I and lambda I): the two runs coincide. With
    tau_i ~ U{1..10} LFedNest's average weights b_i by 1 - (1 - beta)^tau_i and stalls at an s^2-sized
    error, while FedNest's SVRG steps share one target and still converge linearly; FedAvg-S (simultaneous
    steps, client-specific 2x2 maps) stalls higher than LFedNest."""

    def final(name, s=1.0, drift=True):
        cfg = _config(s=s, seed=seed, outer_iterations=60, heterogeneity=DRIFT if drift else None, **FIG4[name])
        return np.array(simulate(cfg, MPI.COMM_SELF).history["x_sq_error"])

    same_f, same_l = final("fednest", drift=False), final("lfednest", drift=False)
    np.testing.assert_allclose(same_l[:25], same_f[:25], rtol=1e-6)  # no drift: the same iterates
    fednest, lfednest, fedavg_s = final("fednest"), final("lfednest"), final("fedavg_s")
    assert fednest[-1] < 1e-20 * fednest[0]  # linear convergence despite drift
    assert lfednest[-1] > 1e-12 and abs(lfednest[-1] / lfednest[-10] - 1) < 1e-3  # a plateau
    assert lfednest[-1] < 0.8 * fedavg_s[-1]  # "LFedNest slightly outperforms FedAvg-S"
    ratio = final("lfednest", s=10.0)[-1] / lfednest[-1]
    assert ratio == pytest.approx(100.0, rel=1e-3)  # the drift bias is proportional to s (error to s^2)
