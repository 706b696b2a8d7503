"""Loss-function tuning on long-tail MNIST (FedNest paper section 4.2, Figure 3).

Following Li et al. (2021, AutoBalance) the outer variable x parametrises the VS-loss of Kini et
al. (2021): per-class multiplicative and additive logit adjustments,

    vs(z, t; x) = CE(Delta * z + iota, t),   Delta = 2 sigmoid(delta),   x = (delta, iota) in R^20,

and the inner variable y is **all** weights of a 784-H1-H2-10 MLP (H1 = 200, H2 = 100 in the paper;
178,110 numbers; a width of 0 drops its layer, so H1 = H2 = 0 is multinomial logistic regression,
convex in y, for single-level drift studies) trained with that loss:

    g_i(x, y) = mean_j vs(z_y(a_j), t_j; x) over client i's inner (train) split + (lambda/2) ||y||^2
    f_i(x, y) = mean_j omega_{t_j} CE(z_y(a_j), t_j) over client i's outer (validation) split

with class weights omega_c = 1 / (C pi_c), pi_c the class frequency of the long-tail training set,
so that E[f_i] over the long-tail distribution is the class-balanced validation loss. f does not
depend on x: the direct gradient is zero (the paper notes this), and the hypergradient is
-nabla^2_xy g . [nabla^2_yy g]^{-1} nabla_y f alone.

x = 0 is plain cross-entropy. With ``tune_loss = false`` the problem keeps x at 0 (the x-oracles
return zero), so the same config gives the untuned baseline of Figure 3.

Departures from the authors' code (``docs/reference.md``): Delta = 2 sigmoid(delta), so x = 0 is
plain cross-entropy (they use sigmoid(delta), which halves the logits at initialisation); the
bound Delta < 2 matters: with an unbounded Delta = exp(delta) non-iid runs diverged within 10
outer iterations (measured); the outer weights omega_c are the inverse class
priors scaled to mean 1 over the data (theirs: mu^{-c} normalised to unit Euclidean norm); the
paper's 784-200-100-10 MLP (their HEAD builds 784-200-10); a squared L2 term for strong convexity.

Oracles: y enters through a deep network, so the oracles use reverse-mode autograd on the
**batched** network (:class:`~fednest_mpi.problems.autograd_oracles.AutogradOracles`: one graph for
a whole block of clients; second-order products are double-backward, never a Hessian).

Long-tail set: class c keeps its first ceil(6000 mu^c) training images (mu = ratio^{-1/9}),
5923 / 3597 / ... / 61 = 14,818 images for ratio 100 (MNIST's class 0 has only 5,923).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fednest_mpi import rng
from fednest_mpi.data import long_tail_indices
from fednest_mpi.problems import kernels, mlp
from fednest_mpi.problems.autograd_oracles import AutogradOracles
from fednest_mpi.problems.base import (
    BilevelProblem,
    Sample,
    _one_client_as_two,
    is_shared,
    shared_rows,
    squared_norms,
)
from fednest_mpi.problems.clientdata import ClientSplit, image_clients
from fednest_mpi.problems.shared_start import private_weights_sgd, shared_start_sgd, worthwhile

N_PIXELS, N_CLASSES = 784, 10
_EVAL_CHUNK = 5000


def _cross_entropy(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy (B, n) of logits z (B, n, C), computed on the contiguous (B n, C) view:
    the class-dim-1 layout z.transpose(1, 2) gives a strided gradient, and its weight-gradient bmm
    took 2.1 s instead of 0.2 s for 10 clients x 5,592 rows (measured, docs/performance.md)."""
    return torch.nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]), t.reshape(-1), reduction="none").reshape(
        t.shape
    )


class LossTuningProblem(AutogradOracles, BilevelProblem):
    primary_metric = "balanced_accuracy"
    fresh_outputs = True  # hvp_yy_inner: new rows (torch.empty per call, or autograd's)
    """See the module docstring. ``clients`` lists the client ids this instance hosts."""

    # set by ImageClients.attach: the hosted samples and their per-client splits
    _first: int
    inputs: torch.Tensor
    targets: torch.Tensor
    inner: ClientSplit
    outer: ClientSplit

    @classmethod
    def implementation_for(cls, cfg):
        """The derived oracles over a network (:class:`~fednest_mpi.problems.models.ModelLossTuning`) when
        ``cfg.model`` or ``cfg.derived_oracles`` asks for them; else these closed forms."""
        if cfg.model or cfg.derived_oracles:
            from fednest_mpi.problems.models import ModelLossTuning

            return ModelLossTuning
        return cls

    def __init__(self, cfg, seed: int, clients, device="cpu", dtype=torch.float32):
        super().__init__()
        self.cfg, self.seed = cfg, seed
        self.n_clients = cfg.n_clients
        self.device, self.dtype = torch.device(device), dtype
        self.widths = (N_PIXELS, *(h for h in (cfg.hidden1, cfg.hidden2) if h > 0), N_CLASSES)
        self.shapes = [(o, i) for i, o in zip(self.widths[:-1], self.widths[1:])]
        self.dim_x = 2 * N_CLASSES
        self.dim_y = sum(o * i + o for o, i in self.shapes)
        data = image_clients(cfg, seed, clients, self.device, dtype, select=long_tail_select(cfg))
        data.attach(self)
        self.class_sizes = np.bincount(data.train_labels, minlength=N_CLASSES)
        self.class_weights = class_weights(self.class_sizes, dtype, self.device)

    # -- parameters ----------------------------------------------------------------------------
    def _layers(self, y):
        """[(W (B, out, in), b (B, out))] of the batched MLP parameters ``y`` (B, d2)."""
        layers, at = [], 0
        for out, inp in self.shapes:
            W = y[:, at : at + out * inp].reshape(-1, out, inp)
            at += out * inp
            layers.append((W, y[:, at : at + out]))
            at += out
        return layers

    def initial_point(self):
        """x = 0 (plain cross-entropy); y: :func:`mlp_initial_point`."""
        y = mlp_initial_point(self.shapes, self.seed, self.dtype, self.device)
        return torch.zeros(self.dim_x, dtype=self.dtype, device=self.device), y

    # -- batched losses --------------------------------------------------------------------------
    def _logits(self, A, y):
        if self._shared(y):  # the global y: GEMMs over all the block's samples, no per-client weights
            return mlp.forward([(W[0], b[0]) for W, b in self._layers(y[:1])], A)[1][-1]
        h = A
        layers = self._layers(y)
        for j, (W, b) in enumerate(layers):
            h = torch.baddbmm(b[:, None, :], h, W.transpose(1, 2))
            if j < len(layers) - 1:
                h = torch.relu(h)
        return h

    def _batch(self, split: ClientSplit, clients, sample, batch_size):
        clients = np.asarray(clients, dtype=np.int64)
        rows = clients - self._first
        cols, weights = split.batch(rows, clients, sample, batch_size)
        pos = torch.as_tensor(split.positions(rows, cols), device=self.device)
        inputs = self.inputs.index_select(0, pos.reshape(-1)).view(*pos.shape, self.inputs.shape[1])  # 2x inputs[pos]
        return inputs, self.targets[pos], torch.as_tensor(weights, dtype=self.dtype, device=self.device)

    def _inner_losses(self, clients, x, y, sample, batch_size):
        """Per-client VS-loss (B,) without the regulariser."""
        A, t, w = self._batch(self.inner, clients, sample, batch_size)
        z = self._logits(A, y)
        if self.cfg.tune_loss:
            z = z * (2.0 * kernels.sigmoid(x[:, None, :N_CLASSES])) + x[:, None, N_CLASSES:]
        return (w * _cross_entropy(z, t)).sum(1)

    def _outer_losses(self, clients, y, sample):
        """Per-client class-weighted validation cross-entropy (B,)."""
        A, t, w = self._batch(self.outer, clients, sample, self.cfg.hypergradient_batch_size)
        return (w * self.class_weights[t] * _cross_entropy(self._logits(A, y), t)).sum(1)

    # -- fused local SGD from the shared y (FedAvg / LFedInn): no per-client weight copies per step --
    def _local_sgd(self, clients, x, y, steps, lr, key, anchor):
        """Closed-form batched backpropagation of the MLP: the low-rank form of local SGD / SVRG from
        shared weights (:func:`~fednest_mpi.problems.shared_start.shared_start_sgd`) for short local
        runs, private per-client weights updated in place (:func:`.private_weights_sgd`) for long ones."""
        clients = np.asarray(clients, dtype=np.int64)
        if clients.size == 0 or steps == 0:
            return y.expand(clients.size, -1).clone()
        X = shared_rows(x, clients.size)
        scale = 2.0 * kernels.sigmoid(X[:, None, :N_CLASSES]) if self.cfg.tune_loss else None
        shift = X[:, None, N_CLASSES:] if self.cfg.tune_loss else None

        def batch(nu):
            A, t, w = self._batch(self.inner, clients, Sample(key, nu), self.cfg.batch_size)
            return A, lambda logits: self._inner_residual(logits, t, w, scale, shift)[0]

        def layers(vector):
            return [(W[0], b[0]) for W, b in self._layers(vector[None])]

        run = shared_start_sgd if worthwhile(steps, self.cfg.batch_size, anchor is not None) else private_weights_sgd
        return run(
            layers(y), batch, steps, lr, self.cfg.inner_regularization, None if anchor is None else layers(anchor)
        )

    def local_sgd_bytes(self, steps, anchored):
        """The low-rank form (short local runs) holds per client its history (inputs and logit
        gradients of every layer, steps x batch rows, twice with the anchor), a step's activations
        and, for the ordered reduction, one dense row of y; longer runs keep private weights: the
        default estimate."""
        if not worthwhile(steps, self.cfg.batch_size, anchored):
            return None
        rows = steps * self.cfg.batch_size * (2 if anchored else 1)
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        widths = sum(self.widths)
        return itemsize * (self.dim_y + 2 * rows * widths + 4 * self.cfg.batch_size * widths)

    def x_side_bytes(self) -> int | None:
        """Per client, rows of the 2C numbers of x and the second-order pass (:meth:`_pass_bytes`); None where a
        subclass computes the Jacobian product its own way."""
        if type(self)._jvp_xy_inner is not LossTuningProblem._jvp_xy_inner:
            return None
        return self._pass_bytes() + 8 * self.dim_x * self.dtype.itemsize

    def factored_rows_bytes(self) -> int | None:
        """The working set per client of :meth:`hvp_rows` (and :meth:`gradient_rows`, which holds less) where its
        factors are the smaller (:meth:`_pass_bytes`); None otherwise (the dense rows: the default estimate), or
        where a subclass computes the product its own way."""
        if type(self)._hvp_yy_inner is not LossTuningProblem._hvp_yy_inner:
            return None
        if 2 * self._pass_rows() * sum(o + i for o, i in self.shapes) >= self.dim_y:
            return None
        return self._pass_bytes()

    def _pass_rows(self) -> int:
        """Samples per client of the widest pass at the shared y: the wider split, or the second-order batch."""
        width = max(self.inner.index.shape[1], self.outer.index.shape[1])
        return width if self.cfg.hypergradient_batch_size <= 0 else min(width, self.cfg.hypergradient_batch_size)

    def _pass_bytes(self) -> int:
        """Per sample of :meth:`_pass_rows`: its gathered inputs and, at every layer, the forward pass, its
        R-forward, the deltas and their R-derivatives and the concatenated factors (12 numbers per layer output)."""
        return self.dtype.itemsize * self._pass_rows() * (N_PIXELS + 12 * sum(self.widths))

    # -- oracles: closed form when y (and v) are the shared global rows (mlp.py), else reverse-mode
    # -- autograd on the batched network (AutogradOracles); x frozen at 0 when the loss is not tuned --
    @staticmethod
    def _shared(*rows) -> bool:
        return all(is_shared(r) for r in rows)

    def _shared_pass(self, split, clients, x, y, sample, batch_size):
        """Forward pass of the shared network y on the clients' (mini)batches: (layers, inputs,
        pre-activations, targets, weights, VS scale (C, 1, classes) or None, VS shift or None)."""
        A, t, w = self._batch(split, clients, sample, batch_size)
        layers = [(W[0], b[0]) for W, b in self._layers(y[:1])]
        inputs, pre = mlp.forward(layers, A)
        scale = 2.0 * kernels.sigmoid(x[:, None, :N_CLASSES]) if self.cfg.tune_loss else None
        shift = x[:, None, N_CLASSES:] if self.cfg.tune_loss else None
        return layers, inputs, pre, t, w, scale, shift

    @staticmethod
    def _softmax_residual(z, t, w):
        """w (softmax(z) - e_t): the gradient of sum_j w_j CE(z_j, t_j) in z; and softmax(z)."""
        p = torch.softmax(z, dim=-1)
        G = p.clone().scatter_add_(-1, t[..., None], torch.full_like(p[..., :1], -1.0)).mul_(w[..., None])
        return G, p

    def _inner_residual(self, logits, t, w, scale, shift):
        """(dg/dlogits of the VS-loss, softmax of the adjusted logits)."""
        if scale is None:
            return self._softmax_residual(logits, t, w)
        G, p = self._softmax_residual(logits * scale + shift, t, w)
        return G.mul_(scale), p

    def _rows_out(self, clients) -> torch.Tensor:
        return torch.empty(len(clients), self.dim_y, dtype=self.dtype, device=self.device)

    def _grad_y_inner(self, clients, x, y, sample):
        if not self._shared(y):
            return super()._grad_y_inner(clients, x, y, sample)
        layers, inputs, pre, t, w, scale, shift = self._shared_pass(
            self.inner, clients, x, y, sample, self.cfg.batch_size
        )
        G, _ = self._inner_residual(pre[-1], t, w, scale, shift)
        out = mlp.client_gradients(inputs, mlp.backward(layers, pre, G), self._rows_out(clients))
        return out.add_(y[0], alpha=self.cfg.inner_regularization)

    def _grad_y_outer(self, clients, x, y, sample):
        if not self._shared(y):
            return super()._grad_y_outer(clients, x, y, sample)
        layers, inputs, pre, t, w, _, _ = self._shared_pass(
            self.outer, clients, x, y, sample, self.cfg.hypergradient_batch_size
        )
        G, _ = self._softmax_residual(pre[-1], t, w * self.class_weights[t])
        return mlp.client_gradients(inputs, mlp.backward(layers, pre, G), self._rows_out(clients))

    def _second_order_pass(self, clients, x, y, v, sample):
        """The shared forward pass on the second-order minibatch and its R-forward along v:
        (layers, direction, inputs, pre, R-inputs, R-outputs, targets, weights, scale, shift)."""
        layers, inputs, pre, t, w, scale, shift = self._shared_pass(
            self.inner, clients, x, y, sample, self.cfg.hypergradient_batch_size
        )
        direction = [(V[0], b[0]) for V, b in self._layers(v[:1])]
        r_inputs, r_pre = mlp.r_forward(layers, direction, inputs, pre)
        return layers, direction, inputs, pre, r_inputs, r_pre[-1], t, w, scale, shift

    def _hvp_yy_inner(self, clients, x, y, v, sample):
        """nabla^2_yy g_i v by the R-operator (mlp.py): R{dg/dlogits} = w s J (s R{logits}), J = diag(p) - p p^T."""
        if not self._shared(y, v):
            return super()._hvp_yy_inner(clients, x, y, v, sample)
        inputs, deltas, r_inputs, r_deltas = self._hvp_terms(clients, x, y, v, sample)
        out = mlp.client_gradients(inputs, deltas, self._rows_out(clients), r_inputs, r_deltas)
        return out.add_(v[0], alpha=self.cfg.inner_regularization)

    def _hvp_terms(self, clients, x, y, v, sample):
        """The per-sample layer inputs, deltas and their R-derivatives along v of the Hessian-vector product."""
        layers, direction, inputs, pre, r_inputs, r_out, t, w, scale, shift = self._second_order_pass(
            clients, x, y, v, sample
        )
        G, p = self._inner_residual(pre[-1], t, w, scale, shift)
        u = r_out if scale is None else r_out * scale
        r_G = (p * u - p * (p * u).sum(-1, keepdim=True)).mul_(w[..., None])
        if scale is not None:
            r_G.mul_(scale)
        deltas = mlp.backward(layers, pre, G)
        return inputs, deltas, r_inputs, mlp.r_backward(layers, direction, pre, deltas, r_G)

    def gradient_rows(self, oracle: str, clients, x, y, sample) -> mlp.GradientRows | None:
        """nabla_y g_i (``oracle = "grad_y_inner"``, FedInn's anchor) or nabla_y f_i (``"grad_y_outer"``, FedIHGP's
        right-hand side) of :meth:`grad_y_inner` / :meth:`grad_y_outer` at the shared y, factored
        (:class:`~fednest_mpi.problems.mlp.GradientRows`: per layer delta against h, and lambda y shared for g),
        for the exact reduction's summation groups; counted as the oracle; made dense where the factors are not
        the smaller. None where the closed form does not apply (y not shared) or a subclass has its own oracle."""
        own = getattr(LossTuningProblem, "_" + oracle)
        if getattr(type(self), "_" + oracle) is not own or not self._shared(y):
            return None
        self.oracle_counts[oracle] += len(clients)
        rows = _one_client_as_two(self._gradient_factors, np.asarray(clients), oracle, x, y, sample)
        return rows if rows.compact else rows.dense()

    def _gradient_factors(self, clients, oracle, x, y, sample) -> mlp.GradientRows:
        if oracle == "grad_y_inner":
            layers, inputs, pre, t, w, scale, shift = self._shared_pass(
                self.inner, clients, x, y, sample, self.cfg.batch_size
            )
            G, _ = self._inner_residual(pre[-1], t, w, scale, shift)
            shared = self.cfg.inner_regularization * y[0]
        else:
            layers, inputs, pre, t, w, _, _ = self._shared_pass(
                self.outer, clients, x, y, sample, self.cfg.hypergradient_batch_size
            )
            G, _ = self._softmax_residual(pre[-1], t, w * self.class_weights[t])
            shared = torch.zeros_like(y[0])
        deltas = mlp.backward(layers, pre, G)
        return mlp.GradientRows([(delta, h, delta.sum(1)) for h, delta in zip(inputs, deltas)], shared)

    def hvp_rows(self, clients, x, y, v, sample) -> mlp.GradientRows | None:
        """nabla^2_yy g_i v of :meth:`hvp_yy_inner`, factored (:class:`~fednest_mpi.problems.mlp.GradientRows`:
        per layer [R{delta}, delta] against [h, R{h}], and lambda v shared), for the exact reduction's summation
        groups; counted as the oracle; made dense where the factors are not the smaller. None where the closed
        form does not apply (rows not shared) or a subclass has its own oracle."""
        if type(self)._hvp_yy_inner is not LossTuningProblem._hvp_yy_inner or not self._shared(y, v):
            return None
        self.oracle_counts["hvp_yy_inner"] += len(clients)
        rows = _one_client_as_two(self._hvp_factors, np.asarray(clients), x, y, v, sample)
        return rows if rows.compact else rows.dense()

    def _hvp_factors(self, clients, x, y, v, sample) -> mlp.GradientRows:
        inputs, deltas, r_inputs, r_deltas = self._hvp_terms(clients, x, y, v, sample)
        # the first layer's R{h} is 0 (the input does not depend on y): its term is R{delta}^T h alone
        factors = [(r_deltas[0], inputs[0], r_deltas[0].sum(1))] + [
            (torch.cat([r_delta, delta], dim=1), torch.cat([h, r_h], dim=1), r_delta.sum(1))
            for h, delta, r_h, r_delta in zip(inputs[1:], deltas[1:], r_inputs[1:], r_deltas[1:])
        ]
        return mlp.GradientRows(factors, self.cfg.inner_regularization * v[0])

    def _jvp_xy_inner(self, clients, x, y, v, sample):
        """nabla_x <nabla_y g_i, v>: with u = s R{logits}, phi = sum_j w_j (p_j - e_j)^T u_j and
        d phi / d iota = sum_j w_j J_j u_j, d phi / d s = sum_j w_j ((J_j u_j) o_j + (p_j - e_j) R{o_j}),
        d s / d delta = s (1 - s / 2)."""
        if not self.cfg.tune_loss:
            return torch.zeros(len(clients), self.dim_x, dtype=self.dtype, device=self.device)
        if not self._shared(y, v):
            return super()._jvp_xy_inner(clients, x, y, v, sample)
        _, _, _, pre, _, r_out, t, w, scale, shift = self._second_order_pass(clients, x, y, v, sample)
        G, p = self._softmax_residual(pre[-1] * scale + shift, t, w)  # w (p - e)
        u = r_out * scale
        Ju = (p * u - p * (p * u).sum(-1, keepdim=True)).mul_(w[..., None])
        d_shift = Ju.sum(1)
        d_scale = (Ju * pre[-1] + G * r_out).sum(1)
        return torch.cat([d_scale * scale[:, 0] * (1.0 - 0.5 * scale[:, 0]), d_shift], dim=1)

    def inner_value(self, clients, x, y):
        """g_i(x, y): VS-loss on the whole inner split + (lambda/2) ||y||^2 (not counted)."""
        return self._inner_losses(clients, x, y, None, 0) + 0.5 * self.cfg.inner_regularization * squared_norms(y)

    def outer_value(self, clients, x, y):
        """f_i(x, y): class-weighted cross-entropy on the whole outer split (not counted)."""
        return self._outer_losses(clients, y, None)

    def correct_counts(self, clients, x, y):
        """(correct, total) predictions of the network (plain logits, as at test time) on each client's inner split."""
        A, t, w = self._batch(self.inner, clients, None, 0)
        valid = w > 0
        hit = (self._logits(A, y).argmax(-1) == t) & valid
        return hit.sum(1), valid.sum(1)

    # -- evaluation ----------------------------------------------------------------------------
    def metric_info(self):
        return METRICS

    def evaluate(self, x, y):
        with torch.no_grad():
            logits = torch.cat([self._logits(chunk[None], y[None])[0] for chunk in self.test_inputs.split(_EVAL_CHUNK)])
        return metrics_of(logits, self.test_targets)


# -- what the closed-form problem shares with the derived one over any network (problems/models.py) --
METRICS = {
    "test_accuracy": ("accuracy on the 10k test set", "%", True),
    "balanced_accuracy": ("class-balanced accuracy on the 10k test set: mean of the per-class recalls", "%", True),
    "test_loss": ("mean cross-entropy of the network's logits on the 10k test set", "nats"),
    "tail_accuracy": ("mean recall of the five rarest classes (5-9) on the test set", "%", True),
}


def metrics_of(logits: torch.Tensor, t: torch.Tensor) -> dict[str, float]:
    """The :data:`METRICS` of test-set logits (n, C) and labels (n,)."""
    correct = (logits.argmax(1) == t).to(torch.float64)
    recall = torch.zeros(N_CLASSES, dtype=torch.float64).index_add_(0, t.cpu(), correct.cpu()) / torch.bincount(
        t.cpu(), minlength=N_CLASSES
    )
    return {
        "test_accuracy": 100.0 * float(correct.mean()),
        "balanced_accuracy": 100.0 * float(recall.mean()),
        "test_loss": float(torch.nn.functional.cross_entropy(logits, t)),
        "tail_accuracy": 100.0 * float(recall[N_CLASSES // 2 :].mean()),
    }


def long_tail_select(cfg):
    """labels -> the indices of the long-tail training set (the module docstring)."""
    return lambda labels: long_tail_indices(labels, N_CLASSES, cfg.max_per_class, cfg.imbalance_ratio)


def class_weights(class_sizes: np.ndarray, dtype, device) -> torch.Tensor:
    """omega_c = 1 / (C pi_c), pi_c the class frequency of the (long-tail) training set."""
    prior = class_sizes / class_sizes.sum()
    return torch.as_tensor(1.0 / (N_CLASSES * prior), dtype=dtype, device=device)


def mlp_initial_point(shapes, seed: int, dtype, device) -> torch.Tensor:
    """The MLP's flat parameters [W_1, b_1, ...] for layer shapes [(out, in)]: PyTorch's default Linear
    init U(+-1/sqrt(fan_in)), keyed by the seed (layer l's weight by tag 2 l, its bias by 2 l + 1)."""
    parts = []
    for layer, (out, inp) in enumerate(shapes):
        for tag, n in ((2 * layer, out * inp), (2 * layer + 1, out)):
            u = rng.uniform(rng.key(seed, rng.Purpose.INIT, tag), n)
            parts.append(torch.as_tensor((2 * u - 1) / math.sqrt(inp), dtype=dtype, device=device))
    return torch.cat(parts)
