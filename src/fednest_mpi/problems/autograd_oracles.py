"""The five oracles of a problem whose losses are written as batched torch functions, by reverse-mode
autograd (no MPI). For problems with

    g_i(x, y) = inner_losses_i(x, y) + (mu/2) ||y||^2,     f_i(x, y) = outer_losses_i(y)

(f independent of x: zero direct gradient). The batched losses return one value per client of
the block, and client b's value depends on rows b of x and y only, so the gradient of their sum
is the stack of per-client gradients; second-order products are double-backward (Pearlmutter),
never a Hessian. A subclass provides ``_inner_losses(clients, x, y, sample, batch_size)``,
``_outer_losses(clients, y, sample)`` and ``cfg`` with ``batch_size`` (first-order inner
minibatch), ``hypergradient_batch_size`` (second-order minibatch) and ``inner_regularization`` (mu).
"""

from __future__ import annotations

import torch


class AutogradOracles:
    """Mixin for :class:`~fednest_mpi.problems.base.BilevelProblem` subclasses (see the module docstring)."""

    @staticmethod
    def _leaf(rows: torch.Tensor) -> torch.Tensor:
        return rows.detach().clone().requires_grad_(True)

    def _grad_y_inner_graph(self, clients, x, y, sample):
        """(y leaf, nabla_y of the inner losses without the regulariser, with graph) on
        ``hypergradient_batch_size`` samples, for second-order products."""
        y_leaf = self._leaf(y)
        loss = self._inner_losses(clients, x, y_leaf, sample, self.cfg.hypergradient_batch_size).sum()
        (gy,) = torch.autograd.grad(loss, y_leaf, create_graph=True)
        return y_leaf, gy

    def _grad_y_inner(self, clients, x, y, sample):
        with torch.enable_grad():
            y_leaf = self._leaf(y)
            (gy,) = torch.autograd.grad(
                self._inner_losses(clients, x, y_leaf, sample, self.cfg.batch_size).sum(), y_leaf
            )
        return gy + self.cfg.inner_regularization * y

    def _grad_y_outer(self, clients, x, y, sample):
        with torch.enable_grad():
            y_leaf = self._leaf(y)
            (gy,) = torch.autograd.grad(self._outer_losses(clients, y_leaf, sample).sum(), y_leaf)
        return gy

    def _grad_x_outer(self, clients, x, y, sample):
        return torch.zeros(len(clients), self.dim_x, dtype=self.dtype, device=self.device)

    def _hvp_yy_inner(self, clients, x, y, v, sample):
        with torch.enable_grad():
            y_leaf, gy = self._grad_y_inner_graph(clients, x, y, sample)
            (hv,) = torch.autograd.grad((gy * v).sum(), y_leaf)
        return hv + self.cfg.inner_regularization * v

    def _jvp_xy_inner(self, clients, x, y, v, sample):
        with torch.enable_grad():
            x_leaf = self._leaf(x)
            _, gy = self._grad_y_inner_graph(clients, x_leaf, y, sample)
            (jv,) = torch.autograd.grad((gy * v).sum(), x_leaf)
        return jv
