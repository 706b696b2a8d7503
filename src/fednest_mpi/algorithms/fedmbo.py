"""FedMBO (Huang, Zhang & Ji, "Achieving Linear Speedup in Non-IID Federated Bilevel Learning", ICML 2023,
arXiv 2302.05412): a double loop whose lower level is **minibatch SGD on the server** (no local steps, so
no client drift on y) and whose hypergradient is a federated Neumann estimate with a fresh client sample
for every product (the paper's multi-round client sampling), x updated on the server.

Outer iteration k:

1. T = ``inner_rounds`` rounds, each on a fresh client set S_t (INNER_CLIENTS, k, t):
   y <- y - beta mean_{S_t} nabla_y g_i(x, y; zeta_t)                        (one round each);
2. h = FedOut's aggregated hypergradient at (x, y) on a client set S (OUTER_CLIENTS, k) with the
   configured estimator of [nabla^2_yy g]^{-1} nabla_y f (:class:`~fednest_mpi.algorithms.fednest.GlobalHypergradient`;
   the default ``neumann`` is FedIHGP with ``ihgp_resample_clients``: a fresh S_n per product)
   (R + 1 rounds: FedIHGP's R = 1 + N);
3. x <- x - alpha h on the server (no round: every rank holds h).

Rounds per iteration: T + R + 1 (T + N + 2 with FedIHGP). Read where the paper's text was not available
(docs/algorithms.md, "FedMBO"): the exact client-sampling scheme of the Parallel Hypergradient Estimator
(here: FedIHGP's fresh set per product, or any estimator), the step-size schedule (constant) and the
minibatch sizes (the problem's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fednest_mpi.algorithms.fednest import GlobalHypergradient, P
from fednest_mpi.config import algorithm_params as shared
from fednest_mpi.config import spec
from fednest_mpi.problems.base import Sample
from fednest_mpi.recorder import INNER


@dataclass(frozen=True)
class FedMBOParams:
    """FedMBO (Huang, Zhang & Ji 2023): server-side minibatch SGD on y, a resampled federated hypergradient."""

    name: str = spec("fedmbo", "algorithm")
    outer_iterations: int = shared._outer_iterations()
    inner_rounds: int = spec(1, "T: rounds of server-side minibatch SGD on y per outer iteration", low=1)
    clients_per_round: int = shared._clients_per_round()
    inner_lr: float = spec(0.01, "beta: server step size of y on the averaged inner gradient", low=0.0, low_open=True)
    outer_lr: float = spec(0.01, "alpha: server step size of x on the hypergradient h", low=0.0, low_open=True)
    neumann_steps: int = shared._neumann_steps()
    neumann_scale: float = shared._neumann_scale()
    ihgp_mode: str = shared._ihgp_mode()
    ihgp_resample_clients: bool = shared._ihgp_resample_clients()
    hypergradient: str = shared._hypergradient()
    hypergradient_estimator: str = shared._hypergradient_estimator()
    cg_tolerance: float = shared._cg_tolerance()

    check = shared._check_randomized_neumann


class FedMBO(GlobalHypergradient):
    """FedMBO (module docstring): T server-side minibatch-SGD rounds on y, then x - alpha h on the server."""

    Params = FedMBOParams
    summary = "FedMBO (Huang, Zhang & Ji 2023): T server-side SGD rounds on y, the estimator's hypergradient: T + R + 1"
    kind = "a double-loop bilevel method"
    pools_outer_objective = True

    @classmethod
    def rounds_per_iteration(cls, cfg, **options) -> int:
        return cfg.inner_rounds + cls.hypergradient_rounds(cfg)

    def step(self, k: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        prob = self.problem
        for t in range(self.cfg.inner_rounds):
            S_t = self.sample_clients(P.INNER_CLIENTS, k, t)

            def gradients(piece, t=t, y=y):
                ids, n = piece.local_ids, piece.local_ids.size
                self.recorder.took_part(ids, INNER)
                return [
                    prob.grad_y_inner(
                        ids, self._rows(x, n), self._rows(y, n), Sample(self.key(P.INNER_SAMPLE, k, t), 0)
                    )
                ]

            (g,) = self.fed.mean_over(S_t, gradients)
            y = y - self.cfg.inner_lr * g
        h = self.hypergradient(k, x, y, self.sample_clients(P.OUTER_CLIENTS, k))
        return x - self.cfg.outer_lr * h, y, {"hypergradient_estimate_norm": float(torch.linalg.vector_norm(h))}
