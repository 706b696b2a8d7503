"""The sequential baseline: the same f_i, g_i and the same minibatches as a
:class:`~fednest_mpi.problems.representation.RepresentationProblem`, evaluated the way the
authors' code does it -- one client at a time in a Python loop, every oracle by reverse-mode
autograd through that client's network (Hessian- and Jacobian-vector products by double
backward), nothing cached between calls. Written for this project (not the authors' code); the
data are already tensors, so it does not repeat the reference's per-sample image decoding.
"""

from __future__ import annotations

import numpy as np
import torch

from fednest_mpi.problems.base import BilevelProblem


class SequentialProblem(BilevelProblem):
    """Wraps a representation problem; oracles loop over the block's clients."""

    def __init__(self, batched):
        super().__init__()
        self.batched = batched
        self.dim_x, self.dim_y, self.n_clients = batched.dim_x, batched.dim_y, batched.n_clients

    def initial_point(self):
        return self.batched.initial_point()

    def evaluate(self, x, y):
        return self.batched.evaluate(x, y)

    def metric_info(self):
        return self.batched.metric_info()

    # -- one client's losses -----------------------------------------------------------------
    def _loss(self, split, client, x, y, sample, batch_size, regularize):
        """Weighted cross-entropy of one client's (mini)batch, as a differentiable scalar."""
        p = self.batched
        s = p._forward(split, np.array([client]), x[None], y[None], sample, batch_size)
        loss = -(s["w"][0] * (torch.log_softmax(s["logits"][0], -1) * s["E"][0]).sum(-1)).sum()
        return loss + 0.5 * p.cfg.inner_regularization * (y @ y) if regularize else loss

    def _loop(self, clients, X, Y, fn, wrt):
        if not len(clients):
            return X.new_zeros((0, self.dim_x if wrt == "x" else self.dim_y))
        return torch.stack(
            [
                fn(int(c), X[b].detach().clone().requires_grad_(), Y[b].detach().clone().requires_grad_(), b)
                for b, c in enumerate(clients)
            ]
        )

    def _grad(self, clients, x, y, sample, split, batch_size, regularize, wrt):
        def one(c, xc, yc, b):
            (g,) = torch.autograd.grad(
                self._loss(split, c, xc, yc, sample, batch_size, regularize), xc if wrt == "x" else yc
            )
            return g

        return self._loop(clients, x, y, one, wrt)

    def _second(self, clients, x, y, v, sample, wrt):
        p = self.batched

        def one(c, xc, yc, b):
            g = self._loss(p.inner, c, xc, yc, sample, p.cfg.hypergradient_batch_size, True)
            (dy,) = torch.autograd.grad(g, yc, create_graph=True)
            (out,) = torch.autograd.grad(dy @ v[b], xc if wrt == "x" else yc)
            return out

        return self._loop(clients, x, y, one, wrt)

    def _grad_x_outer(self, clients, x, y, sample):
        p = self.batched
        return self._grad(clients, x, y, sample, p.outer, p.cfg.hypergradient_batch_size, False, "x")

    def _grad_y_outer(self, clients, x, y, sample):
        p = self.batched
        return self._grad(clients, x, y, sample, p.outer, p.cfg.hypergradient_batch_size, False, "y")

    def _grad_y_inner(self, clients, x, y, sample):
        p = self.batched
        return self._grad(clients, x, y, sample, p.inner, p.cfg.batch_size, True, "y")

    def _hvp_yy_inner(self, clients, x, y, v, sample):
        return self._second(clients, x, y, v, sample, "y")

    def _jvp_xy_inner(self, clients, x, y, v, sample):
        return self._second(clients, x, y, v, sample, "x")
