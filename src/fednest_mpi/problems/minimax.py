"""Federated saddle-point problem of FedNest section 4.3 (Figure 4) as a bilevel problem, eq. (2).

Client i (data from the counter-based stream ``(seed, PROBLEM_DATA, i)``, independent of ranks):

    f_i(x, y) = -[1/2 ||y||^2 - b_i^T y + y^T A_i x] + lambda/2 ||x||^2,   g_i = -f_i,

with A_i = t_i I, t_i ~ U(0, 0.1), b_i = b'_i - (1/M) sum_j b'_j (centred across all M clients),
b'_i ~ N(0, s^2 I), one shared y and dim_x = dim_y = d. ``min_x max_y (1/M) sum_i f_i`` is the
bilevel problem (1) with g_i = -f_i (paper eq. (2)). With bars for means over all M clients:

    y*(x) = b_bar - t_bar x,     f(x, y*(x)) = 1/2 ||t_bar x - b_bar||^2 + lambda/2 ||x||^2,
    x*    = t_bar b_bar / (t_bar^2 + lambda),   y* = y*(x*)

(x* = y* = 0 up to rounding, because b_bar = 0 by the centring). The oracles are exact:
nabla_x f_i = lambda x - t_i y, nabla_y f_i = -y + b_i - t_i x, nabla^2_yy g_i = I,
nabla^2_xy g_i v = t_i v. ``evaluate`` reports the squared errors of Figure 4.
"""

from __future__ import annotations

import numpy as np
import torch

from fednest_mpi import rng
from fednest_mpi.problems.base import BilevelProblem

_CHUNK = 65536  # clients per chunk of the global mean of b'_i (fixed: rank-independent rounding)


class MinimaxProblem(BilevelProblem):
    """See the module docstring. ``clients`` lists the client ids this instance hosts."""

    def __init__(self, cfg, seed: int, clients, device="cpu", dtype=torch.float64):
        super().__init__()
        self.cfg, self.seed = cfg, seed
        self.n_clients = cfg.n_clients
        self.dim_x = self.dim_y = cfg.dim
        self.device, self.dtype = torch.device(device), dtype
        self._first = clients.start if len(clients) else 0
        ids = np.arange(clients.start, clients.stop) if len(clients) else np.zeros(0, dtype=np.int64)
        t_sum, b_sum = 0.0, np.zeros(cfg.dim)
        for start in range(0, self.n_clients, _CHUNK):
            t, b = self._raw(np.arange(start, min(start + _CHUNK, self.n_clients)))
            t_sum, b_sum = t_sum + t.sum(), b_sum + b.sum(0)
        b_mean = b_sum / self.n_clients
        t, b = self._raw(ids)
        self._t_local = self._tensor(t[:, None])  # (B_local, 1)
        self._b_local = self._tensor(b - b_mean)  # (B_local, d)
        # global means of the centred data, the same on every rank
        self.t_bar = float(t_sum / self.n_clients)
        self.b_bar = self._tensor(b_sum / self.n_clients - b_mean)
        self.x_star, self.y_star = self.saddle_point()

    def _raw(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(t_i, b'_i) of clients ``ids``: t_i ~ U(0, 0.1), b'_i ~ N(0, s^2 I)."""
        k = rng.key(self.seed, rng.Purpose.PROBLEM_DATA, ids)
        t = self.cfg.coupling_max * rng.uniform(rng.key(k, 1), 1)[:, 0]
        return t, self.cfg.heterogeneity * rng.normal(rng.key(k, 2), self.cfg.dim)

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), dtype=self.dtype, device=self.device)

    def _local(self, clients) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(np.asarray(clients, dtype=np.int64) - self._first, device=self.device)
        return self._t_local[idx], self._b_local[idx]

    # -- oracles (exact; the sample key is not used) ----------------------------------------------
    def _grad_x_outer(self, clients, x, y, sample):
        t, _ = self._local(clients)
        return self.cfg.outer_regularization * x - t * y

    def _grad_y_outer(self, clients, x, y, sample):
        t, b = self._local(clients)
        return b - y - t * x

    def _grad_y_inner(self, clients, x, y, sample):
        return -self._grad_y_outer(clients, x, y, sample)

    def _hvp_yy_inner(self, clients, x, y, v, sample):
        return v

    def _jvp_xy_inner(self, clients, x, y, v, sample):
        t, _ = self._local(clients)
        return t * v

    def outer_value(self, clients, x, y):
        """f_i(x, y) per client (a diagnostic, not counted)."""
        t, b = self._local(clients)
        return -(0.5 * y * y - b * y + t * y * x).sum(1) + 0.5 * self.cfg.outer_regularization * (x * x).sum(1)

    def inner_value(self, clients, x, y):
        """g_i(x, y) = -f_i(x, y) per client (a diagnostic, not counted)."""
        return -self.outer_value(clients, x, y)

    # -- closed forms -----------------------------------------------------------------------------
    def inner_solution(self, x: torch.Tensor) -> torch.Tensor:
        """y*(x) = argmax_y f(x, y) = b_bar - t_bar x."""
        return self.b_bar - self.t_bar * x

    def saddle_point(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(x*, y*): x* = argmin_x 1/2 ||t_bar x - b_bar||^2 + lambda/2 ||x||^2 = t_bar b_bar / (t_bar^2 + lambda)."""
        x_star = self.t_bar * self.b_bar / (self.t_bar**2 + self.cfg.outer_regularization)
        return x_star, self.inner_solution(x_star)

    def outer_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """f(x, y) = (1/M) sum_i f_i(x, y)."""
        return -(0.5 * y @ y - self.b_bar @ y + self.t_bar * (y @ x)) + 0.5 * self.cfg.outer_regularization * x @ x

    # -- run interface ----------------------------------------------------------------------------
    def initial_point(self):
        x0 = torch.full((self.dim_x,), self.cfg.initial_value, dtype=self.dtype, device=self.device)
        return x0, x0.clone()

    def metric_info(self):
        return {
            "outer_objective": ("f(x, y*(x)) = max_y f(x, y): the minimax objective at x", "1"),
            "outer_loss": ("f(x, y) = mean_i f_i(x, y) at the current iterates", "1"),
            "x_error": ("||x - x*||", "1"),
            "x_sq_error": ("||x - x*||^2 (Figure 4)", "1"),
            "y_error": ("||y - y*(x)||, distance to the best response to the current x", "1"),
            "y_sq_error": ("||y - y*||^2, distance to the saddle point's y* = y*(x*) (Figure 4)", "1"),
        }

    def evaluate(self, x, y):
        dx = torch.linalg.vector_norm(x - self.x_star)
        return {
            "outer_objective": float(self.outer_loss(x, self.inner_solution(x))),
            "outer_loss": float(self.outer_loss(x, y)),
            "x_error": float(dx),
            "x_sq_error": float(dx**2),
            "y_error": float(torch.linalg.vector_norm(y - self.inner_solution(x))),
            "y_sq_error": float(torch.linalg.vector_norm(y - self.y_star) ** 2),
        }


def fednest_sampling_floor(problem: MinimaxProblem, algorithm) -> tuple[float, float]:
    """Stationary (E||y - y*||^2, E||x - x*||^2) of FedNest's minimax specialisation (eq. (9), T = 1)
    when each round takes |S| < M clients: the floor of Figure 4 at 50 of 1000 clients.

    FedInn's SVRG steps move every y_i towards the optimum of the round's sample, b_S - t_S x
    (b_S, t_S: means over S), contracting by rho = (1 - beta)^tau; FedOut's tau SVRG steps give
    x+ = rho_x x + c t_S' y+ with rho_x = (1 - alpha lambda)^tau, c = (1 - rho_x)/lambda. Near the
    saddle point (x* = y* = 0, b_bar = 0) y is an AR(1) process driven by b_S, whose squared norm
    has mean sigma^2 = sum_coords Var_i(b_i) (1 - |S|/M)/|S| (sampling without replacement), so

        E||y - y*||^2 = sigma^2 (1 - rho)/(1 + rho)
        E||x - x*||^2 = c^2 E||y - y*||^2 [t_bar^2 (1 + rho rho_x)/((1 - rho_x^2)(1 - rho rho_x)) + v_t/(1 - rho_x^2)]

    with v_t = Var_i(t_i) (1 - |S|/M)/|S| (to first order: the t_S x part of the noise is dropped).
    ``problem`` must host all M clients; ``algorithm`` is the algorithm config section.
    """
    if algorithm.inner_rounds != 1 or len(problem._b_local) != problem.n_clients:
        raise ValueError("the closed form needs inner_rounds = 1 and a problem hosting all clients")
    M, n = problem.n_clients, algorithm.clients_per_round
    b, t = problem._b_local.double(), problem._t_local[:, 0].double()
    shrink = (1 - n / M) / n
    rho = (1 - algorithm.inner_lr) ** algorithm.inner_local_steps
    rho_x = (1 - algorithm.outer_lr * problem.cfg.outer_regularization) ** algorithm.outer_local_steps
    var_y = float(b.var(0).sum()) * shrink * (1 - rho) / (1 + rho)
    c = (1 - rho_x) / problem.cfg.outer_regularization
    mix = float(t.mean()) ** 2 * (1 + rho * rho_x) / ((1 - rho_x**2) * (1 - rho * rho_x)) + float(t.var()) * shrink / (
        1 - rho_x**2
    )
    return var_y, c**2 * var_y * mix
