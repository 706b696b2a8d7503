"""Hyper-representation learning on MNIST (FedNest paper section 4.1, Figure 2).

A 784-H-10 MLP (H = ``hidden``, 200 in the paper). The outer variable x is the representation
layer (W1, b1: 157,000 numbers for H = 200), the inner variable y the linear head (W2, b2: 2,010):

    g_i(x, y) = CE(head_y(phi_x(A)), t) on client i's inner (train) split + (lambda/2) ||y||^2
    f_i(x, y) = CE(head_y(phi_x(A)), t) on client i's outer (validation) split

with phi_x(A) = relu(dropout(A W1^T + b1)) (dropout before the ReLU, as in the authors' code;
off by default). The squared L2 term makes every g_i lambda-strongly convex in y, as the paper
assumes; the authors' code adds non-squared norms 0.05 (||W2|| + ||b2||), which is neither smooth
at 0 nor strongly convex (``docs/algorithms.md``).

All oracles are closed-form batched matrix products over a block of clients (no per-client
Python loop, no autograd graph): the head is a generalised linear model, so with P = softmax,
E = one-hot labels, m_j the minibatch weights and J = diag(p) - p p^T,

    nabla_y CE         = sum_j m_j (p_j - e_j) [h_j; 1]^T
    nabla^2_yy CE . v  = sum_j m_j J_j (V2 h_j + vb2) [h_j; 1]^T
    nabla^2_xy CE . v  = back-propagation of  m_j [V2^T (p_j - e_j) + W2^T J_j (V2 h_j + vb2)]  through phi_x

(checked against autograd in ``tests/unit/test_hyperrep.py``).

Minibatches: a client's local step nu of a round with key K reads batch ``nu mod s_i`` of its
epoch ``nu div s_i`` shuffle (s_i = ceil(n_i / batch_size)), the shuffle keyed by (K, client,
epoch); the last batch of an epoch may be short. Clients with fewer samples are padded and
masked, so unequal clients evaluate together.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import torch

from fednest_mpi import rng
from fednest_mpi.data import load_mnist, resolve_data_dir
from fednest_mpi.problems.base import BilevelProblem
from fednest_mpi.problems.clientdata import ClientSplit, HostedSamples, partition_clients

N_PIXELS, N_CLASSES = 784, 10
_DROPOUT_TAG = 11
_EVAL_CHUNK = 5000


class HyperRepresentationProblem(BilevelProblem):
    """See the module docstring. ``clients`` lists the client ids this instance hosts."""

    def __init__(self, cfg, seed: int, clients, device="cpu", dtype=torch.float32):
        super().__init__()
        self.cfg, self.seed = cfg, seed
        self.n_clients = cfg.n_clients
        self.device, self.dtype = torch.device(device), dtype
        h = cfg.hidden
        self.dim_x, self.dim_y = h * N_PIXELS + h, N_CLASSES * h + N_CLASSES
        data = load_mnist(resolve_data_dir(cfg.data_dir or None, cfg.dataset), variant=cfg.dataset)
        splits = partition_clients(data.train_y.numpy(), cfg, seed)
        hosted = HostedSamples(data.train_x, data.train_y, splits, clients, self.device, self.dtype)
        self._first = hosted.first
        self.inputs, self.targets, self.inner, self.outer = hosted.inputs, hosted.targets, hosted.inner, hosted.outer
        self.test_inputs = data.test_x.to(self.device, self.dtype)
        self.test_targets = data.test_y.to(self.device)
        self._features = None  # (clients, x, hidden features) while x is frozen: outer_fixed

    # -- parameters ----------------------------------------------------------------------------
    def _unpack_x(self, x):
        h = self.cfg.hidden
        return x[:, : h * N_PIXELS].reshape(-1, h, N_PIXELS), x[:, h * N_PIXELS:]

    def _unpack_y(self, y):
        h = self.cfg.hidden
        return y[:, : N_CLASSES * h].reshape(-1, N_CLASSES, h), y[:, N_CLASSES * h:]

    def initial_point(self):
        """PyTorch's default Linear initialisation, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), keyed by the seed."""
        h = self.cfg.hidden

        def uniform(tag, n, fan_in):
            u = rng.uniform(rng.key(self.seed, rng.Purpose.INIT, tag), n)
            return torch.as_tensor((2 * u - 1) / math.sqrt(fan_in), dtype=self.dtype, device=self.device)

        x = uniform(1, self.dim_x, N_PIXELS)
        y = uniform(2, self.dim_y, h)
        return x, y

    # -- forward and the pieces every oracle needs -----------------------------------------------
    def _hidden(self, A, x):
        """Pre-activations A W1^T + b1 for (B, b, 784) inputs and x rows (one GEMM when x is shared)."""
        W1, b1 = self._unpack_x(x)
        if x.shape[0] and x.stride(0) == 0:
            return A @ W1[0].T + b1[0]
        return torch.baddbmm(b1[:, None, :], A, W1.transpose(1, 2))

    @contextmanager
    def outer_fixed(self, clients, x):
        """While x is frozen (FedInn), keep the hidden features of the clients' inner splits.

        Without dropout phi_x(A) does not change inside a FedInn round, so it is computed once
        per round for all inner samples of ``clients`` (one GEMM) and every local step only
        gathers its minibatch rows: the 784 x H product leaves the local-step loop.
        """
        if self.cfg.dropout > 0:
            yield
            return
        clients = np.asarray(clients, dtype=np.int64)
        rows = clients - self._first
        pos = self.inner.positions(rows, np.broadcast_to(np.arange(self.inner.index.shape[1]), (len(rows), self.inner.index.shape[1])))
        A = self.inputs[torch.as_tensor(pos, device=self.device)]
        self._features = (clients, x, torch.relu(self._hidden(A, x.expand(len(clients), -1))))
        try:
            yield
        finally:
            self._features = None

    def _cached_features(self, split, clients, x):
        if self._features is None or split is not self.inner:
            return None
        ids, x_fixed, H = self._features
        same_x = x.stride(0) == 0 and x.data_ptr() == x_fixed.data_ptr()
        return H if same_x and np.array_equal(ids, clients) else None

    def _forward(self, split: ClientSplit, clients, x, y, sample, batch_size):
        clients = np.asarray(clients, dtype=np.int64)
        rows = clients - self._first
        cols, weights = split.batch(rows, clients, sample, batch_size)
        pos = torch.as_tensor(split.positions(rows, cols), device=self.device)
        t = self.targets[pos]
        w = torch.as_tensor(weights, dtype=self.dtype, device=self.device)
        cached = self._cached_features(split, clients, x)
        if cached is not None:  # x frozen: no input pass, no x-gradients needed
            A = pre = drop = None
            flat = torch.as_tensor(cols + np.arange(len(cols))[:, None] * cached.shape[1], device=self.device)
            H = cached.flatten(0, 1).index_select(0, flat.flatten()).reshape(*cols.shape, -1)
        else:
            A = self.inputs[pos]  # (B, b, 784)
            pre = self._hidden(A, x)
            drop = self._dropout(clients, sample, pre.shape) if self.cfg.dropout > 0 else None
            if drop is not None:
                pre = pre * drop
            H = torch.relu(pre)
        W2, b2 = self._unpack_y(y)
        logits = torch.baddbmm(b2[:, None, :], H, W2.transpose(1, 2))
        P = torch.softmax(logits, dim=-1)
        E = torch.nn.functional.one_hot(t, N_CLASSES).to(self.dtype)
        return {"A": A, "w": w, "pre": pre, "drop": drop, "H": H, "W2": W2, "P": P, "E": E, "logits": logits}

    def _dropout(self, clients, sample, shape):
        step = -1 if sample is None else sample.step
        key = 0 if sample is None else sample.key
        u = rng.uniform(rng.key(key, step, clients, _DROPOUT_TAG), shape[1] * shape[2]).reshape(shape)
        keep = 1.0 - self.cfg.dropout
        return torch.as_tensor((u < keep) / keep, dtype=self.dtype, device=self.device)

    def _backprop_x(self, s, grad_h):
        """nabla_x of sum_j <grad_h_j, h_j>: through the ReLU and dropout to (W1, b1)."""
        dz = grad_h * (s["pre"] > 0)
        if s["drop"] is not None:
            dz = dz * s["drop"]
        gW1 = torch.bmm(dz.transpose(1, 2), s["A"])
        return torch.cat([gW1.flatten(1), dz.sum(1)], dim=1)

    def _head_grad(self, s, G):
        """(W2, b2) gradient for per-sample logit gradients G (B, b, 10)."""
        return torch.cat([torch.bmm(G.transpose(1, 2), s["H"]).flatten(1), G.sum(1)], dim=1)

    def _residual(self, s):
        return (s["P"] - s["E"]) * s["w"][..., None]

    def _glm_hessian(self, s, v):
        V2, vb2 = self._unpack_y(v)
        U = torch.baddbmm(vb2[:, None, :], s["H"], V2.transpose(1, 2))
        P = s["P"]
        return P * U - P * (P * U).sum(-1, keepdim=True), V2  # J u per sample

    # -- oracles -------------------------------------------------------------------------------
    def _grad_y_inner(self, clients, x, y, sample):
        s = self._forward(self.inner, clients, x, y, sample, self.cfg.batch_size)
        return self._head_grad(s, self._residual(s)) + self.cfg.inner_regularization * y

    def _grad_y_outer(self, clients, x, y, sample):
        s = self._forward(self.outer, clients, x, y, sample, self.cfg.hypergradient_batch_size)
        return self._head_grad(s, self._residual(s))

    def _grad_x_outer(self, clients, x, y, sample):
        s = self._forward(self.outer, clients, x, y, sample, self.cfg.hypergradient_batch_size)
        return self._backprop_x(s, torch.bmm(self._residual(s), s["W2"]))

    def _hvp_yy_inner(self, clients, x, y, v, sample):
        s = self._forward(self.inner, clients, x, y, sample, self.cfg.hypergradient_batch_size)
        Ju, _ = self._glm_hessian(s, v)
        return self._head_grad(s, Ju * s["w"][..., None]) + self.cfg.inner_regularization * v

    def _jvp_xy_inner(self, clients, x, y, v, sample):
        s = self._forward(self.inner, clients, x, y, sample, self.cfg.hypergradient_batch_size)
        Ju, V2 = self._glm_hessian(s, v)
        grad_h = (torch.bmm(self._residual(s), V2) + torch.bmm(Ju * s["w"][..., None], s["W2"]))
        return self._backprop_x(s, grad_h)

    # -- evaluation ----------------------------------------------------------------------------
    def metric_info(self):
        return {
            "test_accuracy": ("accuracy on the 10k test set", "%"),
            "test_loss": ("mean cross-entropy on the 10k test set", "nats"),
        }

    def predict_logits(self, x, y, inputs):
        h = self.cfg.hidden
        W1, b1 = x[: h * N_PIXELS].reshape(h, N_PIXELS), x[h * N_PIXELS:]
        W2, b2 = y[: N_CLASSES * h].reshape(N_CLASSES, h), y[N_CLASSES * h:]
        return torch.cat([torch.relu(chunk @ W1.T + b1) @ W2.T + b2 for chunk in inputs.split(_EVAL_CHUNK)])

    def evaluate(self, x, y):
        logits = self.predict_logits(x, y, self.test_inputs)
        loss = torch.nn.functional.cross_entropy(logits, self.test_targets)
        acc = (logits.argmax(1) == self.test_targets).to(torch.float64).mean()
        return {"test_accuracy": 100.0 * float(acc), "test_loss": float(loss)}
