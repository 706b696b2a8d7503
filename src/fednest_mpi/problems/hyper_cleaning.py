"""Federated data hyper-cleaning on MNIST (Franceschi et al., ICML 2017, federated: each client with its own partly
corrupted training split and clean validation split): FedNest's problem (1) with each client's g_i and f_i on them.

Written on the public problem API alone (docs/extending.md: a :class:`BilevelProblem` with its parameters as
``Params``) and registered the way a plugin is (:meth:`fednest_mpi.registry.Registry.provide`).

A keyed random subset of ``n_samples`` MNIST training images is split into clients (``partition``)
and each client's samples into a training (inner) and a clean validation (outer) split. A fraction
``corruption`` of the training labels is replaced by a uniformly drawn other label, keyed by the
seed and the image's MNIST index. x in R^N (N: all clients' training samples, client 0's first)
gives sample j the weight sigmoid(x_j); y = [W | b], 10 x 785, a multinomial logistic regression:

    g_i(x, y) = sum_j w_j sigmoid(x_j) CE(W a_j + b, noisy label_j) + (lambda/2) ||y||^2
    f_i(x, y) = sum_k w_k CE(W a_k + b, label_k)          (w: 1/batch size, 0 on padding)

With z = W a + b, p = softmax(z), r = p - e_label, u = V a~ (a~ = [a, 1]), the five oracles in
closed form: grad_y g_i = sum_j w_j s_j r_j a~_j^T + lambda y (s = sigmoid(x)); grad^2_yy g_i . V =
sum_j w_j s_j (p_j * u_j - p_j <p_j, u_j>) a~_j^T + lambda V; (grad^2_xy g_i . V)_j = w_j s_j (1 - s_j)
<r_j, u_j> on client i's own samples (0 elsewhere); grad_y f_i likewise with s = 1; grad_x f_i = 0.

Metrics: the test accuracy and loss of y on the 10k MNIST test set, and ``detection_auc``, the ROC AUC of
the weights sigmoid(x_j) for telling clean (positive) from corrupted training labels (0.5 at x0 = 0, where
all weights tie, and when nothing is corrupted). Sigmoid and softmax are :mod:`~fednest_mpi.problems.kernels`'
position-independent ones, so a client's rows do not depend on its block (docs/design.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fednest_mpi import rng
from fednest_mpi.config import ImageClientsConfig, spec
from fednest_mpi.data import load_mnist, resolve_data_dir
from fednest_mpi.errors import ConfigError
from fednest_mpi.problems.base import BilevelProblem
from fednest_mpi.problems.clientdata import HostedSamples, partition_clients
from fednest_mpi.problems.kernels import sigmoid, softmax_

SUBSET, CORRUPT = 9001, 9002  # rng purposes of this problem (beyond fednest_mpi.rng.Purpose, as a plugin's are)
N_CLASSES = 10


@dataclass(frozen=True)
class HyperCleaningParams(ImageClientsConfig):
    """Data hyper-cleaning on MNIST: x = one weight logit per training sample, y = a linear classifier."""

    name: str = spec("hyper_cleaning", "problem kind", choices=("hyper_cleaning",))
    n_samples: int = spec(10000, "MNIST training images used (a random subset keyed by the seed)", low=2)
    corruption: float = spec(0.3, "fraction of training labels replaced by a random other label", low=0.0, high=1.0)


def detection_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for the ``positive`` samples (Mann-Whitney, ties count 1/2);
    0.5 when one class is empty (nothing to tell apart; a NaN would stop the run)."""
    order = np.argsort(scores, kind="stable")
    _, first, counts = np.unique(scores[order], return_index=True, return_counts=True)
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(first + (counts + 1) / 2, counts)
    n1, n0 = int(positive.sum()), int((~positive).sum())
    return float((ranks[positive].sum() - n1 * (n1 + 1) / 2) / (n1 * n0)) if n1 and n0 else 0.5


class HyperCleaning(BilevelProblem):
    """See the module docstring; ``clients`` is the range of client ids this instance hosts."""

    Params = HyperCleaningParams
    summary = "data hyper-cleaning on MNIST: one weight per training sample (x), a linear classifier (y)"
    primary_metric = "test_accuracy"

    def __init__(self, cfg, seed: int, clients, device="cpu", dtype=torch.float32):
        super().__init__()
        if cfg.data_file:  # the corruption is keyed by MNIST indices
            raise ConfigError("problem.data_file: hyper_cleaning draws its clients from MNIST itself; leave it empty")
        self.cfg, self.n_clients, self.device, self.dtype = cfg, cfg.n_clients, torch.device(device), dtype
        data = load_mnist(resolve_data_dir(cfg.data_dir or None, cfg.dataset), variant=cfg.dataset)
        labels = data.train_y.numpy()
        keep = np.sort(rng.permutation(rng.key(seed, SUBSET), len(labels))[: cfg.n_samples])
        splits = [(keep[tr], keep[va]) for tr, va in partition_clients(labels[keep], cfg, seed, equal_shards=False)]
        u = rng.uniform(rng.key(seed, CORRUPT, np.arange(len(labels))), 2)
        flipped = u[:, 0] < cfg.corruption
        noisy = np.where(flipped, (labels + 1 + (u[:, 1] * (N_CLASSES - 1)).astype(np.int64)) % N_CLASSES, labels)
        train = np.concatenate([tr for tr, _ in splits])
        observed = labels.copy()
        observed[train] = noisy[train]  # validation labels stay clean
        self.clean = ~flipped[train]  #: per coordinate of x: whether its label is the true one
        self.offsets = np.concatenate([[0], np.cumsum([len(tr) for tr, _ in splits])])  # client i's x slice
        self.dim_x, self.dim_y = len(train), N_CLASSES * 785
        host = HostedSamples(data.train_x, torch.from_numpy(observed), splits, clients, self.device, dtype)
        self._first, self.inner, self.outer = host.first, host.inner, host.outer
        self.inputs = torch.cat([host.inputs, torch.ones(len(host.inputs), 1, dtype=dtype, device=self.device)], 1)
        self.targets = host.targets
        self.test_inputs, self.test_targets = data.test_x.to(self.device, dtype), data.test_y.to(self.device)

    def _samples(self, split, clients, x, sample, size):
        """Features a~ (B, b, 785), labels t and weights w (B, b), the columns of x (B, b) of the samples
        and, for the inner split, their sigmoids s (ones for the outer split)."""
        clients = np.asarray(clients, dtype=np.int64)
        rows = clients - self._first
        cols, w = split.batch(rows, clients, sample, size)
        pos = torch.as_tensor(split.positions(rows, cols), device=self.device)
        w = torch.as_tensor(w, dtype=self.dtype, device=self.device)
        at = torch.as_tensor(self.offsets[clients][:, None] + cols, device=self.device)
        s = sigmoid(torch.gather(x, 1, at)) if split is self.inner else torch.ones_like(w)
        return self.inputs[pos], self.targets[pos], w, at, s

    def _logits(self, a, y):
        return a @ y.reshape(len(a), N_CLASSES, 785).transpose(1, 2)

    def _batch(self, split, clients, x, y, sample, size):
        """:meth:`_samples` with the residuals r = p - e_label and probabilities p = softmax(z) (B, b, 10)
        in place of the labels."""
        a, t, w, at, s = self._samples(split, clients, x, sample, size)
        p = softmax_(self._logits(a, y))
        r = p - torch.nn.functional.one_hot(t, N_CLASSES).to(p.dtype)
        return a, r, p, w, at, s

    def _rows(self, coef, a):
        return (coef.transpose(1, 2) @ a).reshape(len(a), self.dim_y)

    def _grad_x_outer(self, clients, x, y, sample):
        return torch.zeros(len(clients), self.dim_x, dtype=self.dtype, device=self.device)

    def _grad_y_outer(self, clients, x, y, sample):
        a, r, _, w, _, _ = self._batch(self.outer, clients, x, y, sample, self.cfg.hypergradient_batch_size)
        return self._rows(w[..., None] * r, a)

    def _grad_y_inner(self, clients, x, y, sample):
        a, r, _, w, _, s = self._batch(self.inner, clients, x, y, sample, self.cfg.batch_size)
        return self._rows((w * s)[..., None] * r, a) + self.cfg.inner_regularization * y

    def _hvp_yy_inner(self, clients, x, y, v, sample):
        a, _, p, w, _, s = self._batch(self.inner, clients, x, y, sample, self.cfg.hypergradient_batch_size)
        u = self._logits(a, v)
        hu = p * u - p * (p * u).sum(-1, keepdim=True)
        return self._rows((w * s)[..., None] * hu, a) + self.cfg.inner_regularization * v

    def _jvp_xy_inner(self, clients, x, y, v, sample):
        a, r, _, w, at, s = self._batch(self.inner, clients, x, y, sample, self.cfg.hypergradient_batch_size)
        u = self._logits(a, v)
        out = torch.zeros(len(a), self.dim_x, dtype=self.dtype, device=self.device)
        return out.scatter_add_(1, at, w * s * (1 - s) * (r * u).sum(-1))

    def _cross_entropy(self, split, clients, x, y):
        """sum_j w_j s_j CE_j over each client's whole split (s = 1 on the outer split), shape (B,)."""
        a, t, w, _, s = self._samples(split, clients, x, None, 0)
        z = self._logits(a, y)
        ce = torch.logsumexp(z, -1) - torch.gather(z, -1, t[..., None])[..., 0]
        return (w * s * ce).sum(1)

    def inner_value(self, clients, x, y):
        """g_i(x, y) on each client's whole training split (regulariser included)."""
        reg = 0.5 * self.cfg.inner_regularization * (y * y).sum(1)
        return self._cross_entropy(self.inner, clients, x, y) + reg

    def outer_value(self, clients, x, y):
        """f_i(x, y) on each client's whole clean validation split."""
        return self._cross_entropy(self.outer, clients, x, y)

    def initial_point(self):
        return tuple(torch.zeros(n, dtype=self.dtype, device=self.device) for n in (self.dim_x, self.dim_y))

    def evaluate(self, x, y):
        W = y.reshape(N_CLASSES, 785)
        logits = self.test_inputs @ W[:, :784].T + W[:, 784]
        accuracy = (logits.argmax(1) == self.test_targets).to(torch.float64).mean()
        return {
            "test_accuracy": 100.0 * float(accuracy),
            "test_loss": float(torch.nn.functional.cross_entropy(logits, self.test_targets)),
            "detection_auc": detection_auc(x.detach().cpu().numpy().astype(np.float64), self.clean),
        }

    def metric_info(self):
        return {
            "test_accuracy": ("accuracy of the linear classifier y on the 10k MNIST test set", "%", True),
            "test_loss": ("mean cross-entropy of y on the 10k MNIST test set", "nats", False),
            "detection_auc": (
                "ROC AUC of the sample weights sigmoid(x_j) for telling clean from corrupted training "
                "labels (1: every clean sample weighs more than every corrupted one; 0.5: chance)",
                "1",
                True,
            ),
        }
