"""Local SGD of a block of clients that all start from the same MLP weights, without per-client
weight copies during the steps (no MPI, no autograd).

Every participant of a FedAvg / LFedInn round (FedNest Alg. 6) starts from the global y. With
weight decay lambda (the (lambda/2)||y||^2 term of g_i) and step eta, a linear layer's weights after
nu local steps are exactly

    W_nu = rho^nu W_0 - eta sum_{mu < nu} rho^(nu-1-mu) D_mu^T H_mu,        rho = 1 - eta lambda,

where H_mu (b x in) is the layer's input and D_mu (b x out) the loss gradient at its output in
step mu, weighted by the minibatch weights: the update stays in the span of the client's own
inputs. So step nu's forward and backward products are

    H_nu W_nu^T = rho^nu H_nu W_0^T - eta sum_mu rho^(nu-1-mu) (H_nu H_mu^T) D_mu
    D_nu W_nu   = rho^nu D_nu W_0   - eta sum_mu rho^(nu-1-mu) (D_nu D_mu^T) H_mu

The products with the shared W_0 are one GEMM for the whole block (C b rows), and the corrections
are small batched products with b x (nu b) Gram matrices (formed and applied by
:func:`~fednest_mpi.problems.kernels.gram` and :func:`~fednest_mpi.problems.kernels.low_rank_add_`,
whose order of additions is this project's own, so a client's bits do not rest on the BLAS's mode);
a client's weights are formed once, at the end (one batched GEMM per layer). Per client and step
this costs the arithmetic of the plain step (a forward and a backward GEMM) plus
O(nu b^2 (in + out)), instead of reading and writing a private copy of every weight matrix at every
step. Biases are per-client vectors, updated as usual.

FedInn's SVRG steps (Alg. 4), y <- y - eta (grad g_i(y_nu; xi) - grad g_i(y; xi) + q) with the
anchor q = mean_S grad g_i(y), keep the same form: W_nu = a_nu W_0 + c_nu Q + (low rank), with
a_{nu+1} = rho a_nu + eta lambda, c_{nu+1} = rho c_nu - eta, and two history terms per step, +D^T H at
y_nu and -D0^T H0 at the shared y (whose forward and backward passes are shared GEMMs).

Exact in exact arithmetic: the same iterates as the plain loop of gradient steps (tested against
autograd SGD and the problem's own oracle loop in ``tests/unit/test_shared_start.py``, to rounding).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from fednest_mpi.problems import kernels, mlp

Batch = tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]

# Largest history (steps x batch x (1, or 2 with an anchor)) for which the low-rank form pays: its
# corrections cost O(steps^2 b^2 (in + out)) per layer and client, the plain step O(in out) memory
# traffic per step; beyond this, per-client weights are cheaper (McMahan's FedAvg task, 50 steps of
# 64, measured slower in the low-rank form; docs/performance.md).
MAX_HISTORY = 128


def worthwhile(steps: int, batch_size: int, anchor: bool) -> bool:
    """Whether :func:`shared_start_sgd` is the cheaper way to run these local steps."""
    return steps * batch_size * (2 if anchor else 1) <= MAX_HISTORY


@dataclass
class LowRankRows:
    """The clients' parameters after the local steps, (C, d) rows in the layout [W_1 (row-major),
    b_1, W_2, b_2, ...], held factored: W_l of client i = shared_l + sum_e grads_l[i, e]^T inputs_l[i, e]
    (the history's coefficients folded into ``grads``), b_l of client i = biases_l[i]. The round's
    weighted mean needs no per-client weight matrix (:meth:`weighted_sum`: one GEMM per layer)."""

    shared: list[torch.Tensor]  # (out, in) per layer
    inputs: list[torch.Tensor]  # (C, N, in)
    grads: list[torch.Tensor]  # (C, N, out)
    biases: list[torch.Tensor]  # (C, out)

    @property
    def shape(self) -> tuple[int, int]:
        return self.biases[0].shape[0], sum(W.numel() + W.shape[0] for W in self.shared)

    @property
    def dtype(self) -> torch.dtype:
        return self.biases[0].dtype

    @property
    def device(self) -> torch.device:
        return self.biases[0].device

    def weighted_sum(self, w: torch.Tensor) -> torch.Tensor:
        """sum_i w_i row_i, (d,): per layer w.sum() shared + (w-scaled grads)^T inputs over all C N rows."""
        parts = []
        for W, H, D, b in zip(self.shared, self.inputs, self.grads, self.biases):
            scaled = (D * w[:, None, None]).flatten(0, 1)
            parts += [torch.addmm(W, scaled.T, H.flatten(0, 1), beta=float(w.sum())).reshape(-1), w @ b]
        return torch.cat(parts)

    def part(self, lo: int, hi: int) -> LowRankRows:
        """The rows of clients lo..hi-1, still factored (views of this form's factors)."""
        return LowRankRows(
            self.shared,
            [H[lo:hi] for H in self.inputs],
            [D[lo:hi] for D in self.grads],
            [b[lo:hi] for b in self.biases],
        )

    def group_sum(self, lo: int, hi: int, w: torch.Tensor, out: torch.Tensor, shared: bool = True) -> None:
        """sum_i w_i row_i over clients lo..hi-1 (``w``: their weights) into ``out`` (d,), from these clients'
        factors alone: per layer one GEMM of their (steps x batch) history rows, whose number is the same for
        every client (padded samples are zero rows), so its shape, and with it its bits, depends on the
        clients only, not on the block they were computed in (the exact reduction's summation groups).
        ``shared=False``: without sum(w) times :meth:`shared_row` (the caller adds it once for all groups)."""
        at = 0
        for W, H, D, b in zip(self.shared, self.inputs, self.grads, self.biases):
            scaled = (D[lo:hi] * w[:, None, None]).flatten(0, 1)
            rows = out[at : at + W.numel()].view(W.shape)
            if shared:
                torch.addmm(W, scaled.T, H[lo:hi].flatten(0, 1), beta=float(w.sum()), out=rows)
            else:
                torch.mm(scaled.T, H[lo:hi].flatten(0, 1), out=rows)
            at += W.numel()
            out[at : at + W.shape[0]] = w @ b[lo:hi]
            at += W.shape[0]

    def shared_row(self) -> torch.Tensor:
        """The (d,) part every client's row holds once: the shared weights, zeros at the (per-client) biases."""
        out = torch.zeros(self.shape[1], dtype=self.dtype, device=self.device)
        at = 0
        for W in self.shared:
            out[at : at + W.numel()] = W.reshape(-1)
            at += W.numel() + W.shape[0]
        return out

    def dense(self, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """The (hi - lo, d) rows of clients lo..hi-1 (all by default); each client's row is the same
        product whatever the range, so a block formed in pieces has the bits of the whole."""
        n = self.biases[0].shape[0]
        hi = n if hi is None else min(hi, n)
        C = hi - lo
        out = torch.empty((C, self.shape[1]), dtype=self.dtype, device=self.device)
        at = 0
        for W, H, D, b in zip(self.shared, self.inputs, self.grads, self.biases):
            rows = out[:, at : at + W.numel()].view(C, *W.shape)
            rows.copy_(W.expand(C, -1, -1)).baddbmm_(D[lo:hi].transpose(1, 2), H[lo:hi])
            at += W.numel()
            out[:, at : at + W.shape[0]] = b[lo:hi]
            at += W.shape[0]
        return out


def shared_start_sgd(
    layers: mlp.Layers,
    batch: Callable[[int], Batch],
    steps: int,
    lr: float,
    decay: float,
    anchor: mlp.Layers | None = None,
) -> LowRankRows:
    """Run ``steps`` SGD (or, with ``anchor``, SVRG) steps of a ReLU MLP for a block of C clients
    from shared weights.

    Parameters
    ----------
    layers : the shared starting layers [(W_l (out_l, in_l), b_l (out_l,))].
    batch : ``batch(nu) -> (A, residual)``: step nu's inputs A (C, b, in_0) and a function mapping the
        network's output (C, b, out_L) to the gradient of the clients' weighted minibatch losses with
        respect to it (each client's loss is a weighted sum over its b samples).
    steps, lr, decay : tau, eta and the weight decay lambda of g_i's (lambda/2)||y||^2 (all weights
        and biases).
    anchor : FedInn's q = mean_S grad g_i(y) in the same layout as ``layers`` (SVRG steps), or None.

    Returns the clients' final parameters, factored (:class:`LowRankRows`).
    """
    A, residual = batch(0)
    b = A.shape[1]
    per_step = b if anchor is None else 2 * b
    run = _SharedStart(layers, anchor, A, steps * per_step, lr, decay)
    for nu in range(steps):
        if nu:
            A, residual = batch(nu)
        inputs, pre = run.forward(A)
        run.sgd_step(inputs, run.backward(pre, residual))
        if anchor is not None:
            run.anchor_step(A, residual)
        run.a = run.rho * run.a + (lr * decay if anchor is not None else 0.0)
        run.filled += per_step
    return run.rows()


class _SharedStart:
    """The state of :func:`shared_start_sgd` for C clients: per layer W_nu = a W_0 + c Q (Q: the anchor's
    weights) + sum_j coef_j grad_j in_j^T over the history columns filled so far (each step's inputs of the
    layer and gradients of its output, per client), and the clients' biases (dense)."""

    def __init__(
        self, layers: mlp.Layers, anchor: mlp.Layers | None, A: torch.Tensor, columns: int, lr: float, decay: float
    ):
        C = A.shape[0]
        self.layers, self.anchor, self.lr, self.decay = layers, anchor, lr, decay
        self.history_in = [A.new_empty(C, columns, W.shape[1]) for W, _ in layers]
        self.history_grad = [A.new_empty(C, columns, W.shape[0]) for W, _ in layers]
        self.coef = A.new_zeros(1, columns)  # coefficient of each history column in W_nu
        self.bias = [b0.expand(C, -1).clone() for _, b0 in layers]
        self.rho, self.a, self.c, self.filled = 1.0 - lr * decay, 1.0, 0.0, 0

    def _dense(self, h: torch.Tensor, layer: int, product) -> torch.Tensor:
        """h W_nu^T (``product`` = mlp.linear) or h W_nu (mlp.back), W_nu's dense part (a W_0 + c Q) only."""
        z = product(h, self.layers[layer][0])
        if self.a != 1.0:
            z.mul_(self.a)
        if self.anchor is not None and self.c != 0.0:
            z.add_(product(h, self.anchor[layer][0]), alpha=self.c)
        return z

    def forward(self, A: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each layer's input and pre-activation for the inputs A (C, b, in_0) at the clients' W_nu."""
        past = slice(0, self.filled)
        inputs, pre, H = [], [], A
        for layer in range(len(self.layers)):
            inputs.append(H)
            z = self._dense(H, layer, mlp.linear).add_(self.bias[layer][:, None, :])
            if self.filled:
                kernels.low_rank_add_(
                    z,
                    kernels.gram(H, self.history_in[layer][:, past]).mul_(self.coef[:, past]),
                    self.history_grad[layer][:, past],
                )
            pre.append(z)
            if layer < len(self.layers) - 1:
                H = torch.relu(z)
        return inputs, pre

    def backward(self, pre: list[torch.Tensor], residual) -> list[torch.Tensor]:
        """The gradient of the minibatch losses with respect to each layer's output (back through W_nu)."""
        past = slice(0, self.filled)
        deltas = [residual(pre[-1])]
        for layer in range(len(self.layers) - 1, 0, -1):
            D = deltas[0]
            dH = self._dense(D, layer, mlp.back)
            if self.filled:
                kernels.low_rank_add_(
                    dH,
                    kernels.gram(D, self.history_grad[layer][:, past]).mul_(self.coef[:, past]),
                    self.history_in[layer][:, past],
                )
            deltas.insert(0, dH.mul_(pre[layer - 1] > 0))
        return deltas

    def sgd_step(self, inputs: list[torch.Tensor], deltas: list[torch.Tensor]) -> None:
        """The step -eta (grad + lambda W_nu): the earlier columns decay by rho = 1 - eta lambda, this step's
        b columns enter with coefficient -eta, the biases are updated densely."""
        self.coef[:, slice(0, self.filled)] *= self.rho
        new = slice(self.filled, self.filled + inputs[0].shape[1])
        for layer in range(len(self.layers)):
            self.history_in[layer][:, new] = inputs[layer]
            self.history_grad[layer][:, new] = deltas[layer]
            self.bias[layer].mul_(self.rho).sub_(deltas[layer].sum(1), alpha=self.lr)
        self.coef[:, new] = -self.lr

    def anchor_step(self, A: torch.Tensor, residual) -> None:
        """SVRG's correction: the same minibatch at the shared y, -grad g_i(y; xi) + q, as b more columns."""
        assert self.anchor is not None
        b = A.shape[1]
        inputs0, pre0 = mlp.forward(self.layers, A)
        deltas0 = mlp.backward(self.layers, pre0, residual(pre0[-1]))
        new = slice(self.filled + b, self.filled + 2 * b)
        for layer, (_, b0) in enumerate(self.layers):
            self.history_in[layer][:, new] = inputs0[layer]
            self.history_grad[layer][:, new] = deltas0[layer]
            self.bias[layer].add_(deltas0[layer].sum(1), alpha=self.lr).add_(b0, alpha=self.lr * self.decay).sub_(
                self.anchor[layer][1], alpha=self.lr
            )
        self.coef[:, new] = self.lr
        self.c = self.rho * self.c - self.lr

    def rows(self) -> LowRankRows:
        """The clients' final parameters, factored."""
        anchor = self.anchor
        dense_part = [
            W * self.a if anchor is None else W * self.a + anchor[layer][0] * self.c
            for layer, (W, _) in enumerate(self.layers)
        ]
        return LowRankRows(dense_part, self.history_in, [D.mul_(self.coef.T) for D in self.history_grad], self.bias)


def private_weights_sgd(
    layers: mlp.Layers,
    batch: Callable[[int], Batch],
    steps: int,
    lr: float,
    decay: float,
    anchor: mlp.Layers | None = None,
) -> torch.Tensor:
    """The same local steps as :func:`shared_start_sgd` (same arguments) with a private copy of the
    weights per client, updated in place -- the cheaper form for long local runs (many steps of large
    minibatches, where the low-rank history would outgrow the weights). Closed-form batched
    backpropagation (bmm over the block), no autograd and no allocation of weight-sized tensors per
    step. Returns the (C, d) rows in the layout [W_1, b_1, W_2, b_2, ...]."""
    A, residual = batch(0)
    C = A.shape[0]
    rho = 1.0 - lr * decay
    weights = [W.expand(C, -1, -1).clone() for W, _ in layers]
    biases = [b.expand(C, -1).clone() for _, b in layers]
    for nu in range(steps):
        if nu:
            A, residual = batch(nu)
        inputs, pre, H = [], [], A
        for layer, (W, b) in enumerate(zip(weights, biases)):
            inputs.append(H)
            pre.append(torch.baddbmm(b[:, None, :], H, W.transpose(1, 2)))
            if layer < len(weights) - 1:
                H = torch.relu(pre[-1])
        deltas = [residual(pre[-1])]
        for layer in range(len(weights) - 1, 0, -1):
            deltas.insert(0, torch.bmm(deltas[0], weights[layer]).mul_(pre[layer - 1] > 0))
        if anchor is not None:  # the same minibatch at the shared y: -grad g_i(y; xi) + q
            inputs0, pre0 = mlp.forward(layers, A)
            deltas0 = mlp.backward(layers, pre0, residual(pre0[-1]))
        for layer, (W, b) in enumerate(zip(weights, biases)):
            W.mul_(rho).baddbmm_(deltas[layer].transpose(1, 2), inputs[layer], alpha=-lr)
            b.mul_(rho).sub_(deltas[layer].sum(1), alpha=lr)
            if anchor is not None:
                W0, b0 = layers[layer]
                W.baddbmm_(deltas0[layer].transpose(1, 2), inputs0[layer], alpha=lr).add_(
                    W0 * (lr * decay) - anchor[layer][0] * lr
                )
                b.add_(deltas0[layer].sum(1), alpha=lr).add_(b0 * (lr * decay) - anchor[layer][1] * lr)
    return torch.cat([part for W, b in zip(weights, biases) for part in (W.flatten(1), b)], dim=1)
