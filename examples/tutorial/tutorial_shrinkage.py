"""Federated shrinkage: a bilevel problem with closed-form oracles, the tutorial's own problem (docs/tutorial.md).

Client i holds two target vectors in R^d, a_i (training) and b_i (validation). y is a shrunk estimate of
the training targets, x the log-strengths of a per-coordinate penalty (problem (1) of FedNest):

    g_i(x, y) = 1/2 ||y - a_i||^2 + 1/2 sum_j exp(x_j) y_j^2     (inner: strongly convex in y)
    f_i(x, y) = 1/2 ||y - b_i||^2                                (outer: validation error)

With abar, bbar the means over all M clients: y*(x) = abar / (1 + exp(x)), and x* = log(abar / bbar - 1),
where y*(x*) = bbar. The targets are 3 + u and 1 + u' with u, u' uniform in [-h/2, h/2] (h =
``heterogeneity`` <= 1), so abar > bbar > 0 and x* exists. Client i's targets come from the keyed
stream (seed, DATA, i): the same numbers on every rank, whatever client block asks for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fednest_mpi.api import BilevelProblem, rng, spec

DATA = 8001  # this plugin's rng purpose (beyond fednest_mpi.api.Purpose)


@dataclass(frozen=True)
class ShrinkageParams:
    """Federated shrinkage towards validation targets."""

    name: str = spec("shrinkage", "problem kind")
    n_clients: int = spec(20, "number of clients M", low=1)
    dim: int = spec(10, "d: the length of x and of y", low=1)
    heterogeneity: float = spec(0.5, "width h of the clients' uniform spread around the mean", low=0.0, high=1.0)


class Shrinkage(BilevelProblem):
    """See the module docstring; ``clients`` is the range of client ids this instance hosts."""

    Params = ShrinkageParams
    primary_metric = "x_error"

    def __init__(self, cfg, seed: int, clients, device="cpu", dtype=torch.float64):
        super().__init__()
        self.n_clients, self.dim_x, self.dim_y = cfg.n_clients, cfg.dim, cfg.dim
        ids = np.arange(cfg.n_clients)  # every client's targets (2 M d numbers): a small problem knows x*
        spread = cfg.heterogeneity * (rng.uniform(rng.key(seed, DATA, ids[:, None], [1, 2]), cfg.dim) - 0.5)
        a, b = 3.0 + spread[:, 0], 1.0 + spread[:, 1]  # (M, d) each
        self.x_star = torch.as_tensor(np.log(a.mean(0) / b.mean(0) - 1.0), dtype=dtype, device=device)
        self.y_star = torch.as_tensor(b.mean(0), dtype=dtype, device=device)
        hosted = slice(clients.start, clients.stop)
        self.a, self.b = (torch.as_tensor(t[hosted], dtype=dtype, device=device) for t in (a, b))
        self.first = clients.start

    def rows(self, targets, clients):
        """The rows of ``targets`` (hosted clients) of the block's client ids."""
        return targets[torch.as_tensor(np.asarray(clients) - self.first, dtype=torch.int64, device=targets.device)]

    # the five oracles on a block of B clients: x, y, v are (B, d); each returns (B, d)
    def grad_x_outer(self, clients, x, y, sample):
        return torch.zeros_like(x)  # f_i does not depend on x

    def grad_y_outer(self, clients, x, y, sample):
        return y - self.rows(self.b, clients)

    def grad_y_inner(self, clients, x, y, sample):
        return y - self.rows(self.a, clients) + torch.exp(x) * y

    def hvp_yy_inner(self, clients, x, y, v, sample):
        return (1.0 + torch.exp(x)) * v

    def jvp_xy_inner(self, clients, x, y, v, sample):
        return torch.exp(x) * y * v

    def initial_point(self):
        return torch.zeros_like(self.x_star), torch.zeros_like(self.y_star)

    def evaluate(self, x, y):
        return {
            "x_error": float(torch.linalg.vector_norm(x - self.x_star)),
            "y_error": float(torch.linalg.vector_norm(y - self.y_star)),
        }

    def metric_info(self):
        return {
            "x_error": ("||x - x*||, the distance to the closed-form solution", "1", False),
            "y_error": ("||y - y*(x*)||", "1", False),
        }
