"""FedBiO and FedBiOAcc (Li, Huang & Huang, "Local Stochastic Bilevel Optimization with Momentum-Based
Variance Reduction", arXiv 2205.01608, Algorithms 2 and 3) for the **local lower level** problem

    min_x h(x) = (1/M) sum_m f^(m)(x, y*_m(x)),   y*_m(x) = argmin_y g^(m)(x, y)   (eq. (7)-(8)).

Every client m keeps its own inner variable y^(m) (and, in FedBiOAcc, its inner momentum omega^(m)),
which is **never averaged**; only x (FedBiO) or x, x_{t-1} and the outer momentum nu (FedBiOAcc)
are averaged, every I = ``sync_period`` local iterations. One outer iteration of the runner is one
such communication round: I local iterations, then one fused aggregation.

Local iteration t (global counter t = (k - 1) I + j + 1) of client m, with the local hypergradient
estimate Phi^(m) of eq. (5) (Q = ``neumann_steps`` Hessian products with independent minibatches,
scale eta = ``neumann_scale``; :meth:`~fednest_mpi.algorithms.fednest.LocalHypergradient.local_hypergradient`):

FedBiO (Algorithm 2), ``local_update_order``:
    simultaneous:  y <- y - beta_t grad_y g^(m)(x, y);  x <- x - alpha_t Phi^(m)(x, y)  (both at (x_t, y_t))
    inner_first:   y <- y - beta_t grad_y g^(m)(x, y);  x <- x - alpha_t Phi^(m)(x, y_{t+1})

FedBiOAcc (Algorithm 3), STORM recursions (Cutkosky & Orabona 2019) as in MRBO (Yang, Ji & Liang
2021), the same minibatch at both points of a difference:
    nu    <- Phi^(m)(x_t, y_t) + (1 - a_t) (nu - Phi^(m)(x_{t-1}, y_{t-1}))
    omega <- grad_y g^(m)(x_t, y_t) + (1 - b_t) (omega - grad_y g^(m)(x_{t-1}, y_{t-1}))
    x_{t+1} = x_t - alpha_t nu,   y_{t+1} = y_t - beta_t omega
and the round ends by averaging x_t, x_{t-1} and nu over the participants, so the first momentum
update of the next round runs along the averaged trajectory ("Line 17": x_t, x_{t-1} and nu are
averaged). At t = 1 (and at a client's first participation, for its omega) the weight is 1: the
momentum starts as the fresh estimate.

Not recoverable from the paper text (``../shared/notes/fedbio-and-peers.md`` section 1), chosen
here after the STORM/MRBO template and exposed as config fields: the order of the y and x steps
(``local_update_order``, FedBiO), the step sizes (``step_schedule``: constant, or MRBO's
alpha_t proportional to (u + t)^(-1/3)), the momentum weights a_t = min(1, a_1 (alpha_t/alpha_1)^2),
b_t likewise (MRBO's c alpha_t^2 with c = a_1 / alpha_1^2; ``momentum_outer`` = a_1,
``momentum_inner`` = b_1), and where in the local iteration the averaging falls (above).

Client sampling (the paper has none: Algorithms 2 and 3 update all M clients at every step, which is
``clients_per_round = n_clients``, the shipped configs' choice): a round's participants S
(``clients_per_round``) start from the averaged x (and x_{t-1}, nu) and from their own stored y^(m),
y_{t-1}^(m), omega^(m). A client outside S runs nothing and its rows stay as they were, so a client
that skipped rounds resumes with **stale** state: its y^(m) was last moved for the x of its last
round, and in FedBiOAcc the first STORM differences of its round pair the current averages with its
old rows -- nu's difference Phi^(m)(x_t, y_t) - Phi^(m)(x̄_{t-1}, y_{t-1}^(m)) and omega's
grad_y g^(m)(x_t, y_t) - grad_y g^(m)(x̄_{t-1}, y_{t-1}^(m)), with x̄_{t-1} the server's x_{t-1} of
the previous round and y_{t-1}^(m) the client's y from the next-to-last iteration of its own last
round, however long ago. A client's first round starts omega^(m) as its fresh gradient (weight 1).
With ``clients_per_round = n_clients`` none of this arises. The state lives on the rank that hosts
the client (:class:`ClientStore`), so results do not depend on the number of ranks
(tests/unit/test_fedbio.py checks the stale rows).

System heterogeneity (:mod:`fednest_mpi.heterogeneity`): a member that does not answer a round runs no
local iteration and keeps its stored state, as a client outside S does; a round nobody answered leaves x
(and FedBiOAcc's x_{t-1} and nu) as they were. Every client runs the same I local iterations
(``heterogeneity.local_work`` is refused).

Evaluation: the runner's y is the mean of y^(m) over **all** M clients (not part of the algorithm:
an uncounted bookkeeping reduction, exact or summed in client order unless ``reduction = "sum"``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fednest_mpi.algorithms.base import Algorithm, ClientStore, State
from fednest_mpi.algorithms.fednest import LocalHypergradient, P
from fednest_mpi.federation import Federation, sum_in_client_order
from fednest_mpi.problems.base import BilevelProblem, Sample
from fednest_mpi.recorder import INNER, OUTER


@dataclass
class FedBiOState(State):
    """FedBiO's state: every hosted client's y^(m) (FedBiOAcc: also y_{t-1}^(m) and omega^(m)), and
    FedBiOAcc's averaged x_{t-1} and nu (None before round 1)."""

    clients: ClientStore
    x_prev: torch.Tensor | None = None
    nu: torch.Tensor | None = None


class FedBiO(LocalHypergradient, Algorithm):
    """FedBiO (``accelerated = False``, name ``"fedbio"``) and FedBiOAcc (``True``, ``"fedbioacc"``) with
    the parameters of :class:`~fednest_mpi.config.FedBiOConfig`; see the module docstring."""

    def __init__(self, cfg, problem: BilevelProblem, fed: Federation, seed: int, *, accelerated: bool):
        super().__init__(cfg, problem, fed, seed)
        self.accelerated = accelerated
        x0, y0 = problem.initial_point()
        names = {"y": y0, "y_prev": y0, "omega": torch.zeros_like(y0)} if self.accelerated else {"y": y0}
        self.state: FedBiOState = FedBiOState(ClientStore(fed.block, names))

    @classmethod
    def rounds_per_iteration(cls, cfg, **options) -> int:
        """One fused aggregation per round."""
        return 1

    @property
    def store(self) -> ClientStore:
        """The hosted clients' rows (part of :attr:`state`)."""
        return self.state.clients

    # -- step sizes and momentum weights ---------------------------------------------------------
    def step_factor(self, t: int) -> float:
        """alpha_t / alpha_1 (= beta_t / beta_1): 1, or ((u + 1) / (u + t))^(1/3)."""
        if self.cfg.step_schedule == "constant":
            return 1.0
        u = self.cfg.schedule_offset
        return ((u + 1.0) / (u + t)) ** (1.0 / 3.0)

    # -- one communication round -----------------------------------------------------------------
    def step(self, k: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Round k: I local iterations on the sampled clients, then one fused aggregation."""
        S = self.sample_clients(P.OUTER_CLIENTS, k)
        self.recorder.took_part(S.local_ids, INNER | OUTER)  # every participant updates its y^(m) and x
        if self.accelerated:
            x_new = self._fedbioacc_round(S, k, x)
        else:
            x_new = self._fedbio_round(S, k, x)
        return x_new, self.population_mean("y"), {}

    def _fedbio_round(self, S, k: int, x) -> torch.Tensor:
        (x_new,) = self.fed.mean_over(S, lambda piece: [self._fedbio_local(piece.local_ids, k, x)], fallback=[x])
        return x_new

    def _fedbio_local(self, ids: np.ndarray, k: int, x) -> torch.Tensor:
        """FedBiO's I local iterations of the clients ``ids``; stores their y^(m), returns their x rows."""
        cfg, prob = self.cfg, self.problem
        X, Y = self._rows(x, ids.size), self.store.get("y", ids)
        for j in range(cfg.sync_period):
            f = self.step_factor((k - 1) * cfg.sync_period + j + 1)
            Y_next = Y - f * cfg.inner_lr * prob.grad_y_inner(ids, X, Y, Sample(self.key(P.INNER_SAMPLE, k), j))
            Y_phi = Y_next if cfg.local_update_order == "inner_first" else Y
            X = X - f * cfg.outer_lr * self.local_hypergradient(k, j, ids, X, Y_phi)
            Y = Y_next
        self.store.put(ids, y=Y)
        return X

    def _fedbioacc_round(self, S, k: int, x) -> torch.Tensor:
        anyone = bool(self.fed.answering(S).any())
        x_new, x_prev, nu = self.fed.mean_over(S, lambda piece: self._fedbioacc_local(piece.local_ids, k, x))
        if not anyone:  # no member answered: the server keeps x, x_{t-1} and nu
            return x
        self.state.x_prev, self.state.nu = x_prev, nu
        return x_new

    def _fedbioacc_local(self, ids: np.ndarray, k: int, x) -> list[torch.Tensor]:
        """FedBiOAcc's I local iterations of the clients ``ids``; stores their y^(m), y_{t-1}^(m) and
        omega^(m), returns their (x_t, x_{t-1}, nu) rows. Reads the averaged x_{t-1} and nu of the
        previous round, which the caller replaces only after every chunk is done."""
        cfg, prob = self.cfg, self.problem
        n = ids.size
        X, Y = self._rows(x, n), self.store.get("y", ids)
        st = self.state
        X_prev, Y_prev, Om = (
            self._rows(x if st.x_prev is None else st.x_prev, n),
            self.store.get("y_prev", ids),
            self.store.get("omega", ids),
        )
        Nu = self._rows(torch.zeros_like(x) if st.nu is None else st.nu, n)
        fresh = ~self.store.seen(ids)  # first participation: omega starts as the fresh gradient
        for j in range(cfg.sync_period):
            f = self.step_factor((k - 1) * cfg.sync_period + j + 1)
            a, b = min(1.0, cfg.momentum_outer * f * f), min(1.0, cfg.momentum_inner * f * f)
            first = st.nu is None and j == 0
            s_in = Sample(self.key(P.INNER_SAMPLE, k), j)
            phi = self.local_hypergradient(k, j, ids, X, Y)
            Nu = phi if first else phi + (1.0 - a) * (Nu - self.local_hypergradient(k, j, ids, X_prev, Y_prev))
            gy = prob.grad_y_inner(ids, X, Y, s_in)
            # STORM correction on the rows whose omega exists (at j = 0: clients that took part before)
            r = np.flatnonzero(~fresh) if j == 0 else np.arange(n)
            Om_old, Om = Om[r], gy.clone()
            Om[r] = gy[r] + (1.0 - b) * (Om_old - prob.grad_y_inner(ids[r], X_prev[r], Y_prev[r], s_in))
            X_prev, Y_prev = X, Y
            X, Y = X - f * cfg.outer_lr * Nu, Y - f * cfg.inner_lr * Om
        self.store.put(ids, y=Y, y_prev=Y_prev, omega=Om)
        return [X, X_prev, Nu]

    # -- evaluation --------------------------------------------------------------------------------
    def population_mean(self, name: str) -> torch.Tensor:
        """Mean over all M clients of a stored row, to report the iterate (``Federation.evaluation_sum``: declared
        evaluation-only, so not in the paper's round count):
        with ``reduction = "exact"`` an exact sum (bitwise rank-count invariant), with ``"ordered"`` one slot per
        client summed in client-id order (also bitwise invariant); with ``"sum"`` each rank's partial sum."""
        fed, like = self.fed, self.store.initial[name]
        if fed.reduction == "exact":
            out = fed.evaluation_exact_sum(self.store.block_rows(name)).numpy(force=True)
        elif fed.reduction == "ordered":
            slots = fed.block_slots(self.store.block_rows(name).numpy(force=True))
            out = sum_in_client_order(fed.evaluation_sum(slots))
        else:
            out = fed.evaluation_sum(self.store.block_sum(name).numpy(force=True))
        return torch.as_tensor(out / fed.n_clients, dtype=like.dtype, device=like.device)
