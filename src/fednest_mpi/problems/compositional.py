"""Federated compositional problem (FedNest section 2.1, eq. (2.1); section 3.2) with a known solution.

The bilevel problem (1) with an outer function of y alone and a quadratic inner function:

    min_x f(x) = (1/M) sum_i f_i(y*(x)),   y*(x) = argmin_y (1/M) sum_i g_i(x, y),
    g_i(x, y) = 1/2 ||y - r_i(x)||^2,     r_i(x) = R_i x + c_i                (linear),
    f_i(y)    = 1/2 (y - a_i)^T diag(p_i) (y - a_i),  p_i in [0.5, 2]^{d2}    (quadratic).

So nabla^2_yy g_i = I (kappa_g = 1), the direct gradient nabla_x f_i is zero and
nabla^2_xy g_i v = -R_i^T v (Appendix E, eq. (71)). Client data come from the counter-based
stream ``(seed, PROBLEM_DATA, i)``: R_i, c_i, a_i = shared part + s * client part (s =
``heterogeneity``). With bars for means over all M clients and Pa = mean_i p_i * a_i:

    y*(x) = R x + c,    nabla f(x) = R^T (p * y*(x) - Pa)              (eq. (72)),
    x*    = solve(R^T diag(p) R, R^T (Pa - p * c))    (unique: R has full column rank, d2 >= d1).
"""

from __future__ import annotations

import numpy as np
import torch

from fednest_mpi import rng
from fednest_mpi.problems.base import BilevelProblem

_CHUNK = 1024  # clients per chunk when forming global means (fixed: keeps them rank-independent)
_NAMES = ("R", "c", "a", "p")


class CompositionalProblem(BilevelProblem):
    """See the module docstring. ``clients`` lists the client ids this instance hosts."""

    def __init__(self, cfg, seed: int, clients, device="cpu", dtype=torch.float64):
        super().__init__()
        self.cfg, self.seed = cfg, seed
        self.n_clients = cfg.n_clients
        self.dim_x, self.dim_y = cfg.dim_x, cfg.dim_y
        self.device, self.dtype = torch.device(device), dtype
        self._first = clients.start if len(clients) else 0
        local = self._client_arrays(np.arange(clients.start, clients.stop, dtype=np.int64))
        self._data = {k: self._tensor(local[k]) for k in _NAMES}
        sums = dict.fromkeys(("R", "c", "p", "pa", "paa"), 0.0)
        for start in range(0, self.n_clients, _CHUNK):
            d = self._client_arrays(np.arange(start, min(start + _CHUNK, self.n_clients)))
            part = {
                "R": d["R"].sum(0),
                "c": d["c"].sum(0),
                "p": d["p"].sum(0),
                "pa": (d["p"] * d["a"]).sum(0),
                "paa": (d["p"] * d["a"] ** 2).sum(),
            }
            sums = {k: sums[k] + part[k] for k in sums}
        self._global = {k: self._tensor(np.asarray(v) / self.n_clients) for k, v in sums.items()}
        self.x_star = self.solution()

    def _client_arrays(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        dx, dy, s = self.dim_x, self.dim_y, self.cfg.heterogeneity
        keys = rng.key(self.seed, rng.Purpose.PROBLEM_DATA, ids)
        base = rng.key(self.seed, rng.Purpose.PROBLEM_DATA, -1)
        R0, Ri = (rng.normal(rng.key(k, 1), dy * dx).reshape(-1, dy, dx) / np.sqrt(dx) for k in (base, keys))
        c0, ci = (rng.normal(rng.key(k, 2), dy) for k in (base, keys))
        a0, ai = (rng.normal(rng.key(k, 3), dy) for k in (base, keys))
        return {
            "R": R0 + s * Ri,
            "c": c0 + s * ci,
            "a": a0 + s * ai,
            "p": 0.5 + 1.5 * rng.uniform(rng.key(keys, 4), dy),
        }

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), dtype=self.dtype, device=self.device)

    def _local(self, name: str, clients) -> torch.Tensor:
        idx = torch.as_tensor(np.asarray(clients, dtype=np.int64) - self._first, device=self.device)
        return self._data[name][idx]

    # -- oracles (exact; the sample key is not used) ----------------------------------------------
    def _grad_x_outer(self, clients, x, y, sample):
        return torch.zeros_like(x)

    def _grad_y_outer(self, clients, x, y, sample):
        return self._local("p", clients) * (y - self._local("a", clients))

    def _grad_y_inner(self, clients, x, y, sample):
        return y - torch.einsum("bij,bj->bi", self._local("R", clients), x) - self._local("c", clients)

    def _hvp_yy_inner(self, clients, x, y, v, sample):
        return v

    def _jvp_xy_inner(self, clients, x, y, v, sample):
        return -torch.einsum("bij,bi->bj", self._local("R", clients), v)

    def outer_value(self, clients, x, y):
        """f_i(y) per client (a diagnostic, not counted)."""
        r = y - self._local("a", clients)
        return 0.5 * (self._local("p", clients) * r * r).sum(1)

    def inner_value(self, clients, x, y):
        """g_i(x, y) = 1/2 ||y - r_i(x)||^2 per client (a diagnostic, not counted)."""
        return 0.5 * (self._grad_y_inner(clients, x, y, None) ** 2).sum(1)

    # -- closed forms -----------------------------------------------------------------------------
    def inner_solution(self, x: torch.Tensor) -> torch.Tensor:
        """y*(x) = R_bar x + c_bar (mean of the r_i(x))."""
        return self._global["R"] @ x + self._global["c"]

    def hypergradient(self, x: torch.Tensor) -> torch.Tensor:
        """nabla f(x) = R_bar^T (p_bar * y*(x) - Pa_bar), eq. (72)."""
        g = self._global
        return g["R"].T @ (g["p"] * self.inner_solution(x) - g["pa"])

    def solution(self) -> torch.Tensor:
        """x* = argmin_x f(y*(x))."""
        g = self._global
        return torch.linalg.solve(g["R"].T @ (g["p"][:, None] * g["R"]), g["R"].T @ (g["pa"] - g["p"] * g["c"]))

    def outer_loss(self, y: torch.Tensor) -> torch.Tensor:
        """(1/M) sum_i f_i(y)."""
        g = self._global
        return 0.5 * (g["p"] * y) @ y - g["pa"] @ y + 0.5 * g["paa"]

    # -- run interface ----------------------------------------------------------------------------
    def initial_point(self):
        return (
            torch.zeros(self.dim_x, dtype=self.dtype, device=self.device),
            torch.zeros(self.dim_y, dtype=self.dtype, device=self.device),
        )

    def metric_info(self):
        return {
            "outer_objective": ("f(y*(x)) = mean_i f_i(y*(x)): the compositional objective at x", "1"),
            "outer_loss": ("mean_i f_i(y) at the current inner iterate", "1"),
            "x_error": ("||x - x*||", "1"),
            "y_error": ("||y - y*(x)||", "1"),
            "hypergradient_norm": ("||grad f(x)||, exact", "1"),
        }

    def evaluate(self, x, y):
        y_star = self.inner_solution(x)
        return {
            "outer_objective": float(self.outer_loss(y_star)),
            "outer_loss": float(self.outer_loss(y)),
            "x_error": float(torch.linalg.vector_norm(x - self.x_star)),
            "y_error": float(torch.linalg.vector_norm(y - y_star)),
            "hypergradient_norm": float(torch.linalg.vector_norm(self.hypergradient(x))),
        }
