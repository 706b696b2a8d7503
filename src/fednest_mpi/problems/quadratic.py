"""Heterogeneous quadratic bilevel problem with a closed-form solution.

Client i (data drawn from the counter-based stream ``(seed, PROBLEM_DATA, i)``):

    g_i(x, y) = 1/2 y^T G_i y - y^T (B_i x + c_i)                       (inner, mu-strongly convex)
    f_i(x, y) = 1/2 (y - a_i)^T P_i (y - a_i) + lambda/2 ||x||^2 + e_i^T x  (outer)

with G_i = (1-w) G_0 + w G~_i, P_i = (1-w) I + w P~_i, w = s/(1+s) for heterogeneity s, and
B_i, c_i, a_i, e_i = shared part + s * client part. Every G_i has its spectrum in [mu, L], so the
global Hessian G = mean_i G_i too. With bars for means over all M clients:

    y*(x)   = G^-1 (B x + c)
    grad h  = lambda x + e + B^T G^-1 (P y*(x) - Pa)          (Lemma 2.1, eqs. (5a)-(5b))
    x*      = solve(lambda I + M^T P M, -e - M^T (P u - Pa)),  M = G^-1 B, u = G^-1 c

where Pa = mean_i P_i a_i.

``lower_level = "local"`` is the problem of Li, Huang & Huang (FedBiO/FedBiOAcc, eq. (7)-(8)):
every client has its own lower level, y*_i(x) = G_i^-1 (B_i x + c_i) = M_i x + u_i, and

    h(x)    = mean_i f_i(x, y*_i(x))
    grad h  = (lambda I + S) x + e + r,   S = mean_i M_i^T P_i M_i,  r = mean_i M_i^T P_i (u_i - a_i)
    x*_loc  = solve(lambda I + S, -e - r)

(a different problem from FedNest's whenever the clients differ). The metrics then measure this
problem: x_error against x*_loc, y_error of the mean client iterate against mean_i y*_i(x).

The second-order oracles are exact: nabla^2_yy g_i = G_i and
nabla^2_xy g_i v = -B_i^T v. With ``gradient_noise = sigma > 0`` every first-order oracle
called with a sample key adds N(0, sigma^2 I) noise drawn from (sample, client, oracle), an
unbiased stochastic oracle in the sense of Assumption B.

"""

from __future__ import annotations

import numpy as np
import torch

from fednest_mpi import rng
from fednest_mpi.problems.base import BilevelProblem

_CHUNK = 1024  # clients per chunk when forming global means (fixed: keeps them rank-independent)
_TAG = {"grad_x_outer": 1, "grad_y_outer": 2, "grad_y_inner": 3}


def _orthogonal(keys: np.ndarray, d: int) -> np.ndarray:
    # LAPACK through torch (MKL, whose code path run.numerics pins), not numpy's OpenBLAS, whose kernels
    # differ by CPU (SkylakeX vs Haswell give other bits for the same QR: numerics.py)
    q, r = (t.numpy() for t in torch.linalg.qr(torch.from_numpy(rng.normal(keys, d * d).reshape(-1, d, d))))
    return q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]


def _solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a^-1 b for stacks of matrices, by MKL's LAPACK (see :func:`_orthogonal`)."""
    return torch.linalg.solve(torch.from_numpy(a), torch.from_numpy(b)).numpy()


def _spd(keys: np.ndarray, d: int, low: float, high: float) -> np.ndarray:
    q = _orthogonal(rng.key(keys, 1), d)
    lam = low + (high - low) * rng.uniform(rng.key(keys, 2), d)
    return np.einsum("bij,bj,bkj->bik", q, lam, q)


def _rows_times(A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A_b v_b for every row b, shapes (B, n, m) x (B, m) -> (B, n), as an elementwise product and a
    sum over the last axis: each row's result does not depend on how many rows are in the block
    (a batched einsum may take another kernel, and other rounding, for a block of one client,
    which would make results depend on the rank count)."""
    return (A * v[:, None, :]).sum(-1)


def _rows_times_transposed(A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A_b^T v_b for every row b, shapes (B, n, m) x (B, n) -> (B, m); see :func:`_rows_times`."""
    return (A * v[:, :, None]).sum(1)


class QuadraticProblem(BilevelProblem):
    """See the module docstring. ``clients`` lists the client ids this instance hosts."""

    def __init__(self, cfg, seed: int, clients, device="cpu", dtype=torch.float64):
        super().__init__()
        self.cfg = cfg
        self.seed = seed
        self.n_clients = cfg.n_clients
        self.dim_x, self.dim_y = cfg.dim_x, cfg.dim_y
        self.device, self.dtype = torch.device(device), dtype
        self._base = self._client_arrays(np.array([-1]), base=True)
        self._first = clients.start if len(clients) else 0
        local = self._client_arrays(np.arange(clients.start, clients.stop)) if len(clients) else None
        names = ("G", "B", "c", "P", "a", "e")
        self._data = {k: self._t(local[k] if local else np.zeros((0,) + self._base[k].shape[1:])) for k in names}
        self._global = self._global_means()
        self._x_star = self.local_solution() if cfg.lower_level == "local" else self.solution()

    # -- data ----------------------------------------------------------------------------------
    def _client_arrays(self, ids: np.ndarray, base: bool = False) -> dict[str, np.ndarray]:
        c, dx, dy = self.cfg, self.dim_x, self.dim_y
        k = rng.key(self.seed, rng.Purpose.PROBLEM_DATA, ids)
        arrays = {
            "G": _spd(rng.key(k, 1), dy, c.strong_convexity, c.smoothness),
            "B": rng.normal(rng.key(k, 2), dy * dx).reshape(-1, dy, dx) / np.sqrt(dx),
            "c": rng.normal(rng.key(k, 3), dy),
            "P": _spd(rng.key(k, 4), dy, 0.5, 2.0),
            "a": rng.normal(rng.key(k, 5), dy),
            "e": rng.normal(rng.key(k, 6), dx),
        }
        if base:
            return arrays
        s = c.heterogeneity
        w = s / (1.0 + s)
        b = self._base
        return {
            "G": (1 - w) * b["G"] + w * arrays["G"],
            "B": b["B"] + s * arrays["B"],
            "c": b["c"] + s * arrays["c"],
            "P": (1 - w) * np.eye(dy) + w * arrays["P"],
            "a": b["a"] + s * arrays["a"],
            "e": b["e"] + s * arrays["e"],
        }

    def _t(self, a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), dtype=self.dtype, device=self.device)

    def _global_means(self) -> dict[str, torch.Tensor]:
        """Means over all M clients, formed in fixed chunks on every rank (no communication)."""
        sums = None
        for start in range(0, self.n_clients, _CHUNK):
            d = self._client_arrays(np.arange(start, min(start + _CHUNK, self.n_clients)))
            M, u = _solve(d["G"], d["B"]), _solve(d["G"], d["c"][..., None])[..., 0]
            r = u - d["a"]
            part = {
                "G": d["G"].sum(0),
                "B": d["B"].sum(0),
                "c": d["c"].sum(0),
                "P": d["P"].sum(0),
                "M": M.sum(0),
                "u": u.sum(0),
                "MPM": np.einsum("bji,bjk,bkl->il", M, d["P"], M),
                "MPr": np.einsum("bji,bjk,bk->i", M, d["P"], r),
                "rPr": np.einsum("bi,bij,bj->", r, d["P"], r),
                "Pa": np.einsum("bij,bj->i", d["P"], d["a"]),
                "aPa": np.einsum("bi,bij,bj->", d["a"], d["P"], d["a"]),
                "e": d["e"].sum(0),
            }
            sums = part if sums is None else {k: sums[k] + part[k] for k in sums}
        assert sums is not None
        return {k: self._t(np.asarray(v) / self.n_clients) for k, v in sums.items()}

    def _local(self, name: str, clients) -> torch.Tensor:
        idx = torch.as_tensor(np.asarray(clients, dtype=np.int64) - self._first, device=self.device)
        return self._data[name][idx]

    def _noise(self, clients, sample, oracle: str, d: int) -> torch.Tensor | float:
        if sample is None or self.cfg.gradient_noise == 0.0:
            return 0.0
        z = rng.normal(rng.key(sample.key, sample.step, np.asarray(clients, dtype=np.int64), _TAG[oracle]), d)
        return self.cfg.gradient_noise * self._t(z)

    # -- oracles -------------------------------------------------------------------------------
    def _grad_y_inner(self, clients, x, y, sample):
        G, B, c = (self._local(k, clients) for k in "GBc")
        g = _rows_times(G, y) - _rows_times(B, x) - c
        return g + self._noise(clients, sample, "grad_y_inner", self.dim_y)

    def _grad_y_outer(self, clients, x, y, sample):
        P, a = self._local("P", clients), self._local("a", clients)
        return _rows_times(P, y - a) + self._noise(clients, sample, "grad_y_outer", self.dim_y)

    def _grad_x_outer(self, clients, x, y, sample):
        return (
            self.cfg.outer_regularization * x
            + self._local("e", clients)
            + self._noise(clients, sample, "grad_x_outer", self.dim_x)
        )

    def _hvp_yy_inner(self, clients, x, y, v, sample):
        return _rows_times(self._local("G", clients), v)

    def _jvp_xy_inner(self, clients, x, y, v, sample):
        return -_rows_times_transposed(self._local("B", clients), v)

    def inner_value(self, clients, x, y):
        """g_i(x, y) = 1/2 y^T G_i y - y^T (B_i x + c_i) per client (not counted)."""
        G, B, c = (self._local(k, clients) for k in "GBc")
        Gy, Bx = _rows_times(G, y), _rows_times(B, x)
        return (y * (0.5 * Gy - Bx - c)).sum(1)

    def outer_value(self, clients, x, y):
        """f_i(x, y) = 1/2 (y - a_i)^T P_i (y - a_i) + lambda/2 ||x||^2 + e_i^T x per client (not counted)."""
        P, a, e = (self._local(k, clients) for k in "Pae")
        r = y - a
        return (0.5 * r * _rows_times(P, r)).sum(1) + (x * (0.5 * self.cfg.outer_regularization * x + e)).sum(1)

    # -- closed forms --------------------------------------------------------------------------
    @property
    def global_hessian(self) -> torch.Tensor:
        """nabla^2_yy g = mean_i G_i (the same for every x, y)."""
        return self._global["G"]

    def inner_solution(self, x: torch.Tensor) -> torch.Tensor:
        """y*(x) = G^-1 (B x + c)."""
        g = self._global
        return torch.linalg.solve(g["G"], g["B"] @ x + g["c"])

    def hypergradient(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """Surrogate nabla-bar f(x, y) of eq. (5) with the global Hessian; the true nabla h(x) when
        y = y*(x) (default)."""
        g = self._global
        y = self.inner_solution(x) if y is None else y
        return self.cfg.outer_regularization * x + g["e"] + g["B"].T @ torch.linalg.solve(g["G"], g["P"] @ y - g["Pa"])

    def solution(self) -> torch.Tensor:
        """x* = argmin_x f(x, y*(x))."""
        g = self._global
        M = torch.linalg.solve(g["G"], g["B"])
        u = torch.linalg.solve(g["G"], g["c"])
        lhs = (
            self.cfg.outer_regularization * torch.eye(self.dim_x, dtype=self.dtype, device=self.device)
            + M.T @ g["P"] @ M
        )
        return torch.linalg.solve(lhs, -g["e"] - M.T @ (g["P"] @ u - g["Pa"]))

    def outer_objective(self, x, y) -> torch.Tensor:
        """f(x, y) = mean_i f_i(x, y)."""
        g = self._global
        return (
            0.5 * y @ g["P"] @ y
            - y @ g["Pa"]
            + 0.5 * g["aPa"]
            + 0.5 * self.cfg.outer_regularization * x @ x
            + g["e"] @ x
        )

    def inner_objective(self, x, y) -> torch.Tensor:
        """g(x, y) = mean_i g_i(x, y)."""
        g = self._global
        return 0.5 * y @ g["G"] @ y - y @ (g["B"] @ x + g["c"])

    # -- closed forms of the local-lower-level problem (FedBiO/FedBiOAcc, eq. (7)-(8)) -----------
    def client_inner_solutions(self, clients, x: torch.Tensor) -> torch.Tensor:
        """y*_i(x) = G_i^-1 (B_i x + c_i) of hosted clients, shape (B, d2)."""
        G, B, c = (self._local(k, clients) for k in "GBc")
        return torch.linalg.solve(G, torch.einsum("bij,j->bi", B, x) + c)

    def local_inner_solution_mean(self, x: torch.Tensor) -> torch.Tensor:
        """mean_i y*_i(x) over all M clients."""
        return self._global["M"] @ x + self._global["u"]

    def local_hypergradient(self, x: torch.Tensor) -> torch.Tensor:
        """grad h(x) of the local-lower-level problem."""
        g = self._global
        return self.cfg.outer_regularization * x + g["MPM"] @ x + g["e"] + g["MPr"]

    def local_solution(self) -> torch.Tensor:
        """x*_loc = argmin_x mean_i f_i(x, y*_i(x))."""
        g = self._global
        lhs = self.cfg.outer_regularization * torch.eye(self.dim_x, dtype=self.dtype, device=self.device) + g["MPM"]
        return torch.linalg.solve(lhs, -g["e"] - g["MPr"])

    def local_outer_objective(self, x: torch.Tensor) -> torch.Tensor:
        """h(x) = mean_i f_i(x, y*_i(x))."""
        g = self._global
        return (
            0.5 * x @ g["MPM"] @ x
            + x @ g["MPr"]
            + 0.5 * g["rPr"]
            + 0.5 * self.cfg.outer_regularization * x @ x
            + g["e"] @ x
        )

    # -- run interface -------------------------------------------------------------------------
    def initial_point(self):
        return (
            torch.zeros(self.dim_x, dtype=self.dtype, device=self.device),
            torch.zeros(self.dim_y, dtype=self.dtype, device=self.device),
        )

    def metric_info(self):
        return {
            "outer_objective": (
                "f(x, y*(x)): the bilevel objective at x (lower_level = local: mean_i f_i(x, y*_i(x)))",
                "1",
            ),
            "outer_loss": ("f(x, y) = mean_i f_i(x, y) at the current inner iterate", "1"),
            "inner_loss": ("g(x, y) = mean_i g_i(x, y)", "1"),
            "x_error": ("||x - x*|| (x* of the problem named by lower_level)", "1"),
            "y_error": ("||y - y*(x)|| (lower_level = local: y*(x) = mean_i y*_i(x))", "1"),
            "hypergradient_norm": ("||grad f(x, y*(x))|| (lower_level = local: ||grad h(x)||), exact", "1"),
        }

    def evaluate(self, x, y):
        if self.cfg.lower_level == "local":
            return {
                "outer_objective": float(self.local_outer_objective(x)),
                "outer_loss": float(self.outer_objective(x, y)),
                "inner_loss": float(self.inner_objective(x, y)),
                "x_error": float(torch.linalg.vector_norm(x - self._x_star)),
                "y_error": float(torch.linalg.vector_norm(y - self.local_inner_solution_mean(x))),
                "hypergradient_norm": float(torch.linalg.vector_norm(self.local_hypergradient(x))),
            }
        y_star = self.inner_solution(x)
        return {
            "outer_objective": float(self.outer_objective(x, y_star)),
            "outer_loss": float(self.outer_objective(x, y)),
            "inner_loss": float(self.inner_objective(x, y)),
            "x_error": float(torch.linalg.vector_norm(x - self._x_star)),
            "y_error": float(torch.linalg.vector_norm(y - y_star)),
            "hypergradient_norm": float(torch.linalg.vector_norm(self.hypergradient(x))),
        }
