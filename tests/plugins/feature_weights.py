"""Federated hyperparameter learning from the losses of one client: the tutorial of docs/extending.md
("Your own problem from its losses"), a plugin the tests register (``feature_weights:FeatureWeights``)."""

from dataclasses import dataclass

import numpy as np
import torch

from fednest_mpi import rng
from fednest_mpi.config import spec
from fednest_mpi.problems.clientdata import ClientSplit
from fednest_mpi.problems.derived import ClientSamples, LossProblem
from fednest_mpi.problems.kernels import softplus


@dataclass(frozen=True)
class FeatureWeightsParams:
    name: str = spec("feature_weights", "problem kind")
    n_clients: int = spec(20, "number of clients M", low=1)
    n_features: int = spec(10, "features d (x and y have d numbers)", low=1)
    n_samples: int = spec(40, "samples per client (the last quarter: its outer split)", low=4)
    batch_size: int = spec(8, "minibatch of the inner local steps", low=1)
    hypergradient_batch_size: int = spec(0, "minibatch of the other oracles; 0: the whole split", low=0)


class FeatureWeights(LossProblem):
    """Federated hyperparameter learning: y a logistic classifier, x the log-weights of a per-feature
    L2 penalty, g_i = BCE on client i's inner split + 1/2 sum_k exp(x_k) y_k^2, f_i = BCE on its outer split."""

    Params = FeatureWeightsParams
    primary_metric = "test_accuracy"

    def __init__(self, cfg, seed, clients, device="cpu", dtype=torch.float64):
        super().__init__()
        self.cfg, self.n_clients, self.dtype, self.device = cfg, cfg.n_clients, dtype, torch.device(device)
        self.dim_x = self.dim_y = d = cfg.n_features
        n, ids = cfg.n_samples, np.arange(clients.start, clients.stop)
        truth = rng.normal(rng.key(seed, rng.Purpose.PROBLEM_DATA, -1), d) * (np.arange(d) < d // 2)  # half useless

        def draw(keys, m):  # m samples per key: features and labels of the same logistic model
            a = rng.normal(keys, m * d).reshape(-1, d)
            t = (a @ truth + rng.normal(rng.key(keys, 1), m).reshape(-1) > 0).astype(np.float64)
            return torch.as_tensor(a, dtype=dtype, device=device), torch.as_tensor(t, dtype=dtype, device=device)

        inputs, targets = draw(rng.key(seed, rng.Purpose.PROBLEM_DATA, ids), n)  # client i's rows: i n .. i n + n - 1
        starts, n_out = np.arange(len(ids)) * n, n // 4
        inner = ClientSplit.contiguous(starts, np.full(len(ids), n - n_out), n - n_out)
        outer = ClientSplit.contiguous(starts + n - n_out, np.full(len(ids), n_out), n_out)
        self.samples = ClientSamples(
            {"a": inputs, "t": targets}, {"inner": inner, "outer": outer}, clients.start, dtype
        )
        self.test = draw(rng.key(seed, rng.Purpose.PROBLEM_DATA, -2), 2000)

    @staticmethod
    def _bce(y, batch):
        z = batch["a"] @ y
        return (batch["weight"] * (softplus(z) - batch["t"] * z)).sum()

    def inner_loss(self, x, y, batch):
        return self._bce(y, batch) + 0.5 * (torch.exp(x) * y * y).sum()

    def outer_loss(self, x, y, batch):
        return self._bce(y, batch)

    def initial_point(self):
        return (torch.zeros(self.dim_x, dtype=self.dtype, device=self.device),) * 2

    def evaluate(self, x, y):
        a, t = self.test
        z = a @ y
        return {
            "test_accuracy": 100.0 * float(((z > 0).to(t.dtype) == t).double().mean()),
            "test_loss": float((softplus(z) - t * z).mean()),
        }

    def metric_info(self):
        return {"test_accuracy": ("accuracy on 2,000 test samples", "%", True), "test_loss": ("mean BCE", "nats")}
