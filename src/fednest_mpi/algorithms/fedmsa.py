"""FedMSA (Tarzanagh, Li, Sharma & Oymak, "Federated Multi-Sequence Stochastic Approximation with Local
Hypergradient Estimation", arXiv 2306.01648) for federated bilevel problems: the three sequences
z = (y, v, x) -- the inner solution, the Hessian-inverse-vector product and the outer variable -- are
updated together by local steps with a drift correction, two rounds per iteration.

The direction of client i at z = (x, y, v) is D_i(z) = (D_y, D_v, D_x):

    D_y = nabla_y g_i(x, y),   D_v = nabla^2_yy g_i(x, y) v - nabla_y f_i(x, y),
    D_x = nabla_x f_i(x, y) - nabla^2_xy g_i(x, y) v.

Round k, one client set S (``clients_per_round``):

1. (one round) every i in S evaluates D_i at the broadcast z^k; the server forms
   d = mean_S D_i(z^k), with ``momentum`` rho < 1 the STORM-type recursion of the authors' code
   d = mean_S [D_i(z^k) + (1 - rho)(d^{k-1} - D_i(z^{k-1}))] (both points with the same minibatch);
2. (one round) every i in S runs tau = ``local_steps`` steps from z_i^0 = z^k with the corrected
   direction (the local hypergradient estimation: the server's d plus the change of the client's own
   direction since the anchor, as FedNest's FedInn/FedOut correct local steps, eqs. (7)-(8))

       d_i^j = D_i(z_i^j; xi_j) - D_i(z^k; xi_j) + d,   (d_i^0 = d exactly)
       x_i^{j+1} = x_i^j - alpha d_x,  y_i^{j+1} = y_i^j - beta d_y,  v_i^{j+1} = v_i^j - beta_v d_v,

   and the server averages z^{k+1} = mean_S z_i^tau.

At a point where mean_i D_i = 0 (y = y*(x), v = [nabla^2_yy g]^{-1} nabla_y f, nabla h(x) = 0) every
corrected direction is zero, so the fixed point is the exact solution for any tau and any client
heterogeneity (no client drift). Bytes: 2 d_y + d_x numbers in each of the two rounds.

Evidence of what the authors ran (``ucr-optml/FedMSA``, ``core/BLOClient.py``, ``core/ClientManage_blo.py``,
described, not copied; docs/algorithms.md): the anchor round there is taken over **all** clients and the
local round over a sampled set; the local correction is the recursive form
d^j = D_i(z^j) + d^{j-1} - D_i(z^{j-1}) (equal to the one above with exact oracles, with fresh
minibatches at every evaluation); x, y and v move together, y and v with the same step size; the
momentum rho defaults to 0.5 and v is initialised by a FedIHGP call (1 + N rounds) at the first
iteration. Here: one client set for both rounds (FedInn's Alg. 4 structure), v starts at 0 (no extra
rounds), rho = 1 (no momentum) by default, beta_v its own field.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fednest_mpi.algorithms.base import Algorithm, State
from fednest_mpi.algorithms.estimators import hypergradient_direction, quadratic_gradient
from fednest_mpi.config import algorithm_params as shared
from fednest_mpi.config import spec
from fednest_mpi.federation import Participants
from fednest_mpi.problems.base import BilevelProblem, Sample
from fednest_mpi.recorder import INNER, OUTER
from fednest_mpi.rng import Purpose as P


def _positive(default: float, text: str):
    return spec(default, text, low=0.0, low_open=True)


@dataclass(frozen=True)
class FedMSAParams:
    """FedMSA (Tarzanagh et al. 2023): y, v and x by drift-corrected local steps, two rounds per iteration."""

    name: str = spec("fedmsa", "algorithm")
    outer_iterations: int = spec(100, "iterations K (two communication rounds each)", low=1)
    clients_per_round: int = shared._clients_per_round()
    local_steps: int = spec(1, "tau: local steps of every client per iteration (the authors' code: 1)", low=1)
    outer_lr: float = _positive(0.1, "alpha: local step size of x (the authors' code: 0.1)")
    inner_lr: float = _positive(0.1, "beta: local step size of y (the authors' code: 0.1)")
    v_lr: float = _positive(0.1, "beta_v: local step size of v (the authors' code uses beta)")
    momentum: float = spec(
        1.0,
        "rho: weight of the fresh directions in the anchor d; 1 = no momentum (the authors' code: 0.5)",
        low=0.0,
        low_open=True,
        high=1.0,
    )


@dataclass
class FedMSAState(State):
    """The previous anchor point z^{k-1} = (x, y, v) and its direction d^{k-1} (momentum < 1), and v."""

    v: torch.Tensor | None = None
    x_prev: torch.Tensor | None = None
    y_prev: torch.Tensor | None = None
    v_prev: torch.Tensor | None = None
    d_prev: torch.Tensor | None = None


class FedMSA(Algorithm):
    """FedMSA (module docstring): drift-corrected local steps on y, v and x, two rounds per iteration."""

    Params = FedMSAParams
    summary = "FedMSA (Tarzanagh et al. 2023): drift-corrected local steps on y, v and x together: 2 rounds"
    kind = "a single-loop bilevel method"

    def __init__(self, cfg, problem: BilevelProblem, fed, seed: int):
        super().__init__(cfg, problem, fed, seed)
        self.state: FedMSAState = FedMSAState()

    @classmethod
    def rounds_per_iteration(cls, cfg, **options) -> int:
        """The anchor directions, then the averaged local iterates."""
        return 2

    def directions(self, ids: np.ndarray, X, Y, V, k: int, j: int) -> list[torch.Tensor]:
        """(D_y, D_v, D_x) rows of the clients ``ids`` at their (X, Y, V) rows, minibatches of step j."""
        prob = self.problem
        s_out, s_hvp = Sample(self.key(P.OUTER_SAMPLE, k), j), Sample(self.key(P.HVP_SAMPLE, k), j)
        return [
            prob.grad_y_inner(ids, X, Y, Sample(self.key(P.INNER_SAMPLE, k), j)),
            quadratic_gradient(prob, ids, X, Y, V, s_hvp, prob.grad_y_outer(ids, X, Y, s_out)),
            hypergradient_direction(prob, ids, X, Y, V, s_out, s_hvp),
        ]

    def step(self, k: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        cfg, st = self.cfg, self.state
        v = torch.zeros_like(y) if st.v is None else st.v
        S = self.sample_clients(P.OUTER_CLIENTS, k)
        d = self.anchor(k, S, x, y, v)
        d_y, d_v, d_x = torch.split(d, [y.numel(), y.numel(), x.numel()])

        def local(piece):
            ids, n = piece.local_ids, piece.local_ids.size
            self.recorder.took_part(ids, INNER | OUTER)
            X0, Y0, V0 = self._rows(x, n), self._rows(y, n), self._rows(v, n)
            X, Y, V = X0 - cfg.outer_lr * d_x, Y0 - cfg.inner_lr * d_y, V0 - cfg.v_lr * d_v
            for j in range(1, cfg.local_steps):
                now, then = self.directions(ids, X, Y, V, k, j), self.directions(ids, X0, Y0, V0, k, j)
                c_y, c_v, c_x = (a - b for a, b in zip(now, then, strict=True))
                X, Y, V = X - cfg.outer_lr * (c_x + d_x), Y - cfg.inner_lr * (c_y + d_y), V - cfg.v_lr * (c_v + d_v)
            return [X, Y, V]

        x_new, y_new, st.v = self.fed.mean_over(S, local, fallback=[x, y, v])  # nobody answered: z^k stays
        return x_new, y_new, {"hypergradient_estimate_norm": float(torch.linalg.vector_norm(d_x))}

    def anchor(self, k: int, S: Participants, x, y, v) -> torch.Tensor:
        """d = mean_S D_i(z^k) (with momentum: the recursion of the module docstring), one round; the
        step index -1 names its minibatches. Keeps z^k and d for the next iteration's momentum."""
        cfg, st = self.cfg, self.state
        recursive = cfg.momentum < 1.0 and st.d_prev is not None

        def rows(piece):
            ids, n = piece.local_ids, piece.local_ids.size
            D = torch.cat(self.directions(ids, self._rows(x, n), self._rows(y, n), self._rows(v, n), k, -1), 1)
            if recursive:
                assert st.x_prev is not None and st.y_prev is not None and st.v_prev is not None
                before = self.directions(
                    ids, self._rows(st.x_prev, n), self._rows(st.y_prev, n), self._rows(st.v_prev, n), k, -1
                )
                D = D - (1.0 - cfg.momentum) * torch.cat(before, 1)
            return [D]

        (d,) = self.fed.mean_over(S, rows)
        if recursive:
            assert st.d_prev is not None
            d = d + (1.0 - cfg.momentum) * st.d_prev
        if cfg.momentum < 1.0:
            st.x_prev, st.y_prev, st.v_prev, st.d_prev = x, y, v, d
        return d
