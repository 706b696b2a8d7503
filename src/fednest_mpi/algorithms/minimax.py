"""FedAvg-S: the simultaneous federated saddle-point baseline of FedNest section 4.3 (Figure 4).

FedAvg saddle-point (Hou et al. 2021, as compared in the FedNest paper): per outer iteration one
client set S; every i in S starts from the global (x, y) and runs tau simultaneous local steps

    y_{i,nu+1} = y_{i,nu} - beta  nabla_y g_i(x_{i,nu}, y_{i,nu})   (ascent on f_i, since g_i = -f_i)
    x_{i,nu+1} = x_{i,nu} - alpha nabla_x f_i(x_{i,nu}, y_{i,nu})   (descent)

(both from the same (x_{i,nu}, y_{i,nu})), then the server averages x and y in **one** fused
round. tau = ``inner_local_steps``, beta = ``inner_lr``, alpha = ``outer_lr``. FedNest's own
minimax specialisation (eq. (9)) is not here: it is ``fednest`` with ``hypergradient = "direct"``
(:mod:`fednest_mpi.algorithms.fednest`).
"""

from __future__ import annotations

from fednest_mpi.algorithms.base import Algorithm, active_rows, put_rows, take_rows
from fednest_mpi.algorithms.fednest import P
from fednest_mpi.problems.base import Sample
from fednest_mpi.recorder import INNER, OUTER


class FedAvgS(Algorithm):
    """FedAvg-S (see the module docstring) with the parameters of :class:`~fednest_mpi.config.FedAvgSConfig`;
    carries no state across iterations; each client performs its own number of local steps
    (:meth:`~fednest_mpi.federation.Federation.local_steps`)."""

    @classmethod
    def rounds_per_iteration(cls, cfg, **options) -> int:
        """One fused aggregation of x and y."""
        return 1

    def step(self, k: int, x, y):
        """Outer iteration k: tau simultaneous local descent-ascent steps, one fused aggregation."""
        cfg, prob = self.cfg, self.problem
        S = self.sample_clients(P.INNER_CLIENTS, k, 0)

        def local_steps(piece):
            ids, n = piece.local_ids, piece.local_ids.size
            X, Y = self._rows(x, n), self._rows(y, n)
            self.recorder.took_part(ids, INNER | OUTER)  # one set updates both variables
            steps = self.fed.local_steps(ids, k, cfg.inner_local_steps)  # each client's own tau
            for nu in range(cfg.inner_local_steps):
                a = active_rows(steps, nu)
                if a is not None and not a.size:
                    break
                ia, Xa, Ya = ids if a is None else ids[a], take_rows(X, a), take_rows(Y, a)
                gy = prob.grad_y_inner(ia, Xa, Ya, Sample(self.key(P.INNER_SAMPLE, k, 0), nu))
                gx = prob.grad_x_outer(ia, Xa, Ya, Sample(self.key(P.OUTER_SAMPLE, k), nu))
                X, Y = put_rows(X, a, Xa - cfg.outer_lr * gx), put_rows(Y, a, Ya - cfg.inner_lr * gy)
            return [X, Y]

        x_new, y_new = self.fed.mean_over(S, local_steps, fallback=[x, y])
        return x_new, y_new, {}
