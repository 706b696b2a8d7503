"""Federated tuning of one ridge penalty per feature, a fednest-mpi problem plugin in one file (docs/extending.md).

Each client holds a few noisy samples of one linear model over ``dim`` features of which ``informative`` matter,
fewer training samples than features, and a validation split. x in R^dim are log-penalties, y in R^dim the
weights (hyper-parameter optimisation in the sense of Pedregosa, ICML 2016; bilevel problem (1) of FedNest):

    g_i(x, y) = 1/(2n) ||A_i y - b_i||^2 + 1/2 sum_j exp(x_j) y_j^2     (strongly convex in y)
    f_i(x, y) = 1/(2n') ||A'_i y - b'_i||^2                              (validation loss)

The five oracles in closed form: grad_y g_i = A_i^T (A_i y - b_i) / n + e^x * y, grad^2_yy g_i v =
A_i^T A_i v / n + e^x * v, grad^2_xy g_i v = e^x * y * v, grad_y f_i = A'_i^T (A'_i y - b'_i) / n', grad_x f_i = 0.
The oracles are exact (``sample`` is ignored). Client i's data come from the keyed streams (seed, 7001, i),
so they are the same on every rank; the test set and the true weights from (seed, 7002) and (seed, 7003).
Products are written per row (elementwise products summed over the last axis), so a client's rows do not depend
on the other clients of its block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fednest_mpi.api import BilevelProblem, rng, spec

DATA, TEST, TRUTH = 7001, 7002, 7003  # rng purposes of this plugin (beyond fednest_mpi.rng.Purpose)


@dataclass(frozen=True)
class RidgeTuningParams:
    """Ridge regression with one tuned penalty per feature."""

    name: str = spec("ridge_tuning", "problem kind")
    n_clients: int = spec(20, "number of clients M", low=1)
    dim: int = spec(20, "features (the length of x and of y)", low=1)
    informative: int = spec(5, "features with a nonzero true weight", low=0)
    train_samples: int = spec(15, "training samples per client (inner problem)", low=1)
    val_samples: int = spec(15, "validation samples per client (outer problem)", low=1)
    noise: float = spec(0.5, "standard deviation of the label noise", low=0.0)


class RidgeTuning(BilevelProblem):
    """See the module docstring; ``clients`` is the range of client ids this instance hosts."""

    Params = RidgeTuningParams
    primary_metric = "test_loss"

    def __init__(self, cfg, seed: int, clients, device="cpu", dtype=torch.float64):
        super().__init__()
        self.cfg, self.n_clients, self.dim_x, self.dim_y = cfg, cfg.n_clients, cfg.dim, cfg.dim
        d = cfg.dim
        truth = np.where(np.arange(d) < cfg.informative, rng.normal(rng.key(seed, TRUTH), d), 0.0)
        self.truth = torch.as_tensor(truth, dtype=dtype, device=device)

        def samples(keys, count):  # features (K, count, d) and noisy labels (K, count), computed by torch
            a = torch.as_tensor(rng.normal(rng.key(keys, 1), count * d).reshape(len(keys), count, d), dtype=dtype)
            noise = torch.as_tensor(rng.normal(rng.key(keys, 2), count), dtype=dtype)
            return a.to(device), ((a * self.truth).sum(-1) + cfg.noise * noise).to(device)

        keys = rng.key(seed, DATA, np.arange(clients.start, clients.stop))
        self._first = clients.start
        (self.a, self.b), (self.va, self.vb) = (
            samples(rng.key(keys, 1), cfg.train_samples),
            samples(rng.key(keys, 2), cfg.val_samples),
        )
        test_a, test_b = samples(rng.key(seed, TEST)[None], 1000)
        self.test_a, self.test_b = test_a[0], test_b[0]

    def _residual(self, a, b, clients, y):
        """A_i y - b_i (B, samples) and A_i (B, samples, d) of the clients' split (a, b)."""
        rows = torch.as_tensor(np.asarray(clients) - self._first, dtype=torch.int64, device=a.device)
        a = a[rows]
        return (a * y[:, None, :]).sum(-1) - b[rows], a

    def _normal(self, a, b, clients, y):
        """A_i^T (A_i y - b_i) / n of the clients' split (a, b)."""
        r, a = self._residual(a, b, clients, y)
        return (a * r[..., None]).sum(1) / a.shape[1]

    def grad_x_outer(self, clients, x, y, sample):
        return torch.zeros_like(x)

    def grad_y_outer(self, clients, x, y, sample):
        return self._normal(self.va, self.vb, clients, y)

    def grad_y_inner(self, clients, x, y, sample):
        return self._normal(self.a, self.b, clients, y) + torch.exp(x) * y

    def hvp_yy_inner(self, clients, x, y, v, sample):
        return self._normal(self.a, torch.zeros_like(self.b), clients, v) + torch.exp(x) * v

    def jvp_xy_inner(self, clients, x, y, v, sample):
        return torch.exp(x) * y * v

    def inner_value(self, clients, x, y):
        r, _ = self._residual(self.a, self.b, clients, y)
        return 0.5 * (r * r).mean(1) + 0.5 * (torch.exp(x) * y * y).sum(1)

    def outer_value(self, clients, x, y):
        r, _ = self._residual(self.va, self.vb, clients, y)
        return 0.5 * (r * r).mean(1)

    def initial_point(self):
        return torch.zeros_like(self.truth), torch.zeros_like(self.truth)

    def evaluate(self, x, y):
        r = (self.test_a * y).sum(-1) - self.test_b
        return {
            "test_loss": float(0.5 * (r * r).mean()),
            "weight_error": float(torch.linalg.vector_norm(y - self.truth)),
        }

    def metric_info(self):
        return {
            "test_loss": ("1/2 mean squared error of y on 1,000 test samples", "1", False),
            "weight_error": ("||y - w_true||, the distance to the weights that generated the labels", "1", False),
        }
