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
are small batched products with b x (nu b) Gram matrices; a client's weights are formed once, at
the end (one batched GEMM per layer). Per client and step this costs the arithmetic of the plain
step (a forward and a backward GEMM) plus O(nu b^2 (in + out)), instead of reading and writing a
private copy of every weight matrix at every step. Biases are per-client vectors, updated as usual.

Exact in exact arithmetic: the same iterates as the plain loop of gradient steps (tested against
the autograd oracles in ``tests/unit/test_shared_start.py``, to rounding).
"""

from __future__ import annotations

from typing import Callable

import torch

Batch = tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]


def shared_start_sgd(weights: list[torch.Tensor], biases: list[torch.Tensor], batch: Callable[[int], Batch], steps: int,
                     lr: float, decay: float, out: torch.Tensor) -> None:
    """Run ``steps`` SGD steps of a ReLU MLP for a block of C clients from shared weights.

    Parameters
    ----------
    weights, biases : the shared starting layers, ``W_l`` of shape (out_l, in_l) and ``b_l`` (out_l,).
    batch : ``batch(nu) -> (A, residual)``: step nu's inputs A (C, b, in_0) and a function mapping the
        network's output (C, b, out_L) to the gradient of the clients' weighted minibatch losses with
        respect to it (each client's loss is a weighted sum over its b samples).
    steps, lr, decay : tau, eta and the weight decay lambda of g_i's (lambda/2)||y||^2 (all weights
        and biases).
    out : (C, d) rows that receive each client's final parameters, in the layout
        [W_1 (row-major), b_1, W_2, b_2, ...] (written in place).
    """
    n_layers = len(weights)
    A0, _ = batch(0)
    C, b = A0.shape[0], A0.shape[1]
    like = A0
    rho = 1.0 - lr * decay
    inputs = [torch.empty(C, steps * b, W.shape[1], dtype=like.dtype, device=like.device) for W in weights]
    grads = [torch.empty(C, steps * b, W.shape[0], dtype=like.dtype, device=like.device) for W in weights]
    bias = [bb.expand(C, -1).clone() for bb in biases]
    for nu in range(steps):
        A, residual = (A0, _) if nu == 0 else batch(nu)
        now, past = slice(nu * b, (nu + 1) * b), slice(0, nu * b)
        coef = _coefficients(nu, b, lr, rho, like) if nu else None
        scale = rho ** nu
        H, pre = A, []
        for layer, W in enumerate(weights):
            inputs[layer][:, now] = H
            z = torch.mm(H.reshape(-1, W.shape[1]), W.T).view(C, b, W.shape[0])
            if scale != 1.0:
                z.mul_(scale)
            z.add_(bias[layer][:, None, :])
            if coef is not None:
                gram = torch.bmm(H, inputs[layer][:, past].transpose(1, 2)).mul_(coef)
                z.baddbmm_(gram, grads[layer][:, past])
            pre.append(z)
            if layer < n_layers - 1:
                H = torch.relu(z)
        D = residual(pre[-1])
        for layer in reversed(range(n_layers)):
            W = weights[layer]
            grads[layer][:, now] = D
            if layer > 0:
                dH = torch.mm(D.reshape(-1, W.shape[0]), W).view(C, b, W.shape[1])
                if scale != 1.0:
                    dH.mul_(scale)
                if coef is not None:
                    gram = torch.bmm(D, grads[layer][:, past].transpose(1, 2)).mul_(coef)
                    dH.baddbmm_(gram, inputs[layer][:, past])
                next_D = dH.mul_(pre[layer - 1] > 0)
            bias[layer].mul_(rho).add_(D.sum(1), alpha=-lr)
            if layer > 0:
                D = next_D
    final = _coefficients(steps, b, lr, rho, like)[0]  # -eta rho^(tau-1-mu) per column of the history
    at = 0
    for layer, W in enumerate(weights):
        n_out, n_in = W.shape
        rows = out[:, at: at + n_out * n_in].view(C, n_out, n_in)
        rows.copy_((W * rho ** steps).expand(C, -1, -1))
        rows.baddbmm_(grads[layer].mul_(final[:, None]).transpose(1, 2), inputs[layer])
        at += n_out * n_in
        out[:, at: at + n_out] = bias[layer]
        at += n_out


def _coefficients(nu: int, b: int, lr: float, rho: float, like: torch.Tensor) -> torch.Tensor:
    """(1, nu b) factors -eta rho^(nu-1-mu) of the history columns (b per past step mu < nu)."""
    powers = torch.arange(nu - 1, -1, -1, dtype=torch.float64)
    coef = (-lr * rho ** powers).repeat_interleave(b)
    return coef.to(dtype=like.dtype, device=like.device)[None, :]
