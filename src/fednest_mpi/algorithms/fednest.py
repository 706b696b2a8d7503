"""The FedNest family (Tarzanagh et al., ICML 2022), written once against two primitives.

Primitives: a problem's batched client oracles (:mod:`fednest_mpi.problems`) and the counted
aggregation of :class:`~fednest_mpi.federation.Federation`. The paper's variants (Table 2,
appendix H.1) are configurations of one class, :class:`FedNest`, by the switches of :class:`Variant`
(the ``options`` of their entries in :data:`fednest_mpi.config.ALGORITHMS`), not copies of code:

==================  ===================  ===================  ====================
name                outer optimiser      inner optimiser      rounds per outer step
==================  ===================  ===================  ====================
fednest             FedOut (Alg. 2+3)    FedInn SVRG (Alg. 4)  2T + N + 3
fednest_sgd         FedOut (Alg. 2+3)    LFedInn SGD (Alg. 6)  T + N + 3
lfednest            LFedOut (Alg. 5)     LFedInn SGD (Alg. 6)  T + 1
lfednest_svrg       LFedOut (Alg. 5)     FedInn SVRG (Alg. 4)  2T + 1
lfednest_nonalt     LFedOut on local y   LFedInn SGD (Alg. 6)  T (y and x fused)
==================  ===================  ===================  ====================

(with ``ihgp_mode = "randomized"`` FedIHGP uses N' <= N - 1 rounds instead of N; another
``hypergradient_estimator`` (:mod:`~fednest_mpi.algorithms.estimators`) takes its R rounds instead of
FedIHGP's N + 1; with ``hypergradient = "direct"``, the minimax specialisation of eq. (9), FedOut
has no estimator and the hypergradient is the direct gradient: 2 rounds instead of N + 3.)

Every random choice comes from a counter-based key ``(seed, purpose, k, ...)``: client sets,
minibatches and the truncation N' are the same on any number of ranks.

The two levels are also building blocks of other algorithms: :class:`InnerLevel` (FedInn / LFedInn,
used by :class:`~fednest_mpi.algorithms.singlelevel.SingleLevel`), :class:`LocalHypergradient`
(each client's own hypergradient estimate, used by LFedOut and by
:class:`~fednest_mpi.algorithms.fedbio.FedBiO`) and :class:`GlobalHypergradient` (FedOut's aggregated
one with the configured estimator, used by :class:`~fednest_mpi.algorithms.fedmbo.FedMBO`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fednest_mpi import config, rng
from fednest_mpi.algorithms.base import Algorithm, ClientRows, active_rows, put_rows, take_rows
from fednest_mpi.algorithms.estimators import ESTIMATORS, hypergradient_direction, local_neumann
from fednest_mpi.federation import Federation, Participants, dense
from fednest_mpi.problems.base import BilevelProblem, Sample
from fednest_mpi.recorder import INNER, OUTER, row_norms

P = rng.Purpose


@dataclass(frozen=True)
class Variant:
    """Which optimiser runs each level (paper Table 2)."""

    inner_variance_reduction: bool  # FedInn with SVRG correction (Alg. 4) or plain local SGD (Alg. 6)
    global_outer: bool  # FedOut with federated FedIHGP (Alg. 2-3) or LFedOut with local IHGP (Alg. 5)
    alternating: bool = True  # False: LFedNest-NonAlt, y and x trained by the same clients in one round


def rounds_per_iteration(name: str, inner_rounds: int, neumann_steps: int, hypergradient: str = "implicit") -> int:
    """Communication rounds of one outer iteration of the FedNest variant ``name`` in truncated
    FedIHGP mode (paper Table 2); see :meth:`FedNest.rounds_per_iteration`."""
    params = config.FedNestConfig(
        name=name, inner_rounds=inner_rounds, neumann_steps=neumann_steps, hypergradient=hypergradient
    )
    return FedNest.rounds_per_iteration(params, **config.ALGORITHMS[name].options)


class InnerLevel(Algorithm):
    """FedInn (Alg. 4, SVRG) and LFedInn (Alg. 6) rounds on y, for an :class:`Algorithm` whose
    ``inner_variance_reduction`` says which, and whose parameters have ``inner_lr``,
    ``inner_local_steps`` and ``clients_per_round``."""

    inner_variance_reduction: bool

    # -- inner level ----------------------------------------------------------------------------
    def _inner_anchor(self, S: Participants, x, y) -> torch.Tensor | None:
        """FedInn's SVRG anchor q = mean_S G_i(y) on each client's whole local data (Alg. 4; one
        round), recording the members' inner losses and anchor norms; None for LFedInn (Alg. 6),
        which records the losses only."""
        prob, rec = self.problem, self.recorder
        factored = self.factored("gradient_rows")

        def anchors(piece):
            ids = piece.local_ids
            X, Y0 = self._rows(x, ids.size), self._rows(y, ids.size)
            rec.took_part(ids, INNER)
            if not self.inner_variance_reduction:
                rec.record("inner_loss", ids, lambda: prob.inner_value(ids, X, Y0))
                return []
            with prob.outer_fixed(ids, x):
                rec.record("inner_loss", ids, lambda: prob.inner_value(ids, X, Y0))
                anchor = prob.gradient_rows("grad_y_inner", ids, X, Y0, None) if factored else None
                if anchor is None:
                    anchor = prob.grad_y_inner(ids, X, Y0, None)
            rec.record("inner_gradient_norm", ids, lambda: row_norms(anchor))
            return [anchor]

        if not self.inner_variance_reduction:  # every call here is at the shared x: y-side chunks
            for piece in S.chunks(self.fed.chunk_for(self.problem.y_side_bytes())):
                anchors(piece)
            return None
        (q,) = self.mean_y_side(S, anchors, factored=factored)
        return q

    def _inner_local(self, ids: np.ndarray, k: int, t: int, x, y, q) -> torch.Tensor:
        """Local steps of FedInn (Alg. 4, with SVRG; ``q`` the anchor of :meth:`_inner_anchor`) or
        LFedInn (Alg. 6, ``q`` None) of the clients ``ids``; returns their local y_i rows.

        Alg. 4: q_{i,nu} = G_i(y_{i,nu}; zeta_{i,nu}) - G_i(y; zeta_{i,nu}) + q,  q = mean_S G_i(y).
        Each client performs its own number of steps (:meth:`Federation.local_steps`; ``inner_local_steps``
        by default): the clients of each count are run together.
        """
        steps = self.fed.local_steps(ids, k, self.cfg.inner_local_steps)
        counts = np.unique(steps)
        # with uneven work a chunk may hold one step count or several: under groups the rows are then always dense
        if counts.size <= 1 and not (self.fed.sums_groups and self.fed.system.varies_work):
            return self._inner_local_steps(ids, k, t, x, y, q, int(counts[0]) if counts.size else 0)
        rows = y.new_empty((ids.size, y.shape[0]))
        for tau in counts:
            group = np.flatnonzero(steps == tau)
            rows[torch.as_tensor(group, device=y.device)] = dense(
                self._inner_local_steps(ids[group], k, t, x, y, q, int(tau))
            )
        return rows

    def _inner_local_steps(self, ids: np.ndarray, k: int, t: int, x, y, q, steps: int) -> torch.Tensor:
        """:meth:`_inner_local` of clients that all perform ``steps`` local steps."""
        prob, lr = self.problem, self.cfg.inner_lr
        fused = prob.local_sgd(ids, x, y, steps, lr, self.key(P.INNER_SAMPLE, k, t), anchor=q)
        if fused is not None:
            return fused
        n = ids.size
        X, Y0 = self._rows(x, n), self._rows(y, n)
        with prob.outer_fixed(ids, x):
            Y = Y0
            for nu in range(steps):
                s = Sample(self.key(P.INNER_SAMPLE, k, t), nu)
                d = prob.grad_y_inner(ids, X, Y, s)
                if q is not None:
                    d = d - prob.grad_y_inner(ids, X, Y0, s) + q
                Y = Y - lr * d
        return Y

    def fed_inn(self, k: int, t: int, x, y) -> torch.Tensor:
        """FedInn (Alg. 4) or LFedInn (Alg. 6): y+ = mean_S y_{i,tau}. Rounds: 2 (SVRG) or 1."""
        S = self.sample_clients(P.INNER_CLIENTS, k, t)
        q = self._inner_anchor(S, x, y)
        size = self.problem.local_sgd_bytes(self.cfg.inner_local_steps, q is not None)
        (y_new,) = self.fed.mean_over(
            S, lambda piece: [self._inner_local(piece.local_ids, k, t, x, y, q)], client_bytes=size, fallback=[y]
        )
        return y_new


class LocalHypergradient(Algorithm):
    """Each client's hypergradient estimate from its own oracles (LFedOut's and FedBiO's), for an
    :class:`Algorithm` whose parameters have ``hypergradient``, ``ihgp_mode``, ``neumann_steps`` and
    ``neumann_scale``."""

    def local_hypergradient(self, k: int, nu: int, ids: np.ndarray, X, Y) -> torch.Tensor:
        """Each client's hypergradient estimate from its own oracles alone (LFedOut, Alg. 5; the
        estimator Phi of FedBiO/FedBiOAcc, eq. (5) of Li et al.):

        h_i = nabla_x f_i(X_i, Y_i; xi) - nabla^2_xy g_i(X_i, Y_i) p_i,
        p_i = local Neumann approximation of [nabla^2_yy g_i]^{-1} nabla_y f_i(X_i, Y_i; xi),

        xi from (OUTER_SAMPLE, k, step nu), an independent minibatch per Hessian product from
        (HVP_SAMPLE, k, nu). The same (k, nu) gives the same minibatches (STORM differences).
        With ``hypergradient = "direct"`` (minimax, eq. (9)): the local direct gradient only.
        """
        cfg, prob = self.cfg, self.problem
        s = Sample(self.key(P.OUTER_SAMPLE, k), nu)
        if cfg.hypergradient == "direct":
            return prob.grad_x_outer(ids, X, Y, s)
        p = local_neumann(self, k, nu, ids, X, Y, prob.grad_y_outer(ids, X, Y, s))
        jvp_sample = Sample(self.key(P.HVP_SAMPLE, k, nu), cfg.neumann_steps + 1)
        return hypergradient_direction(prob, ids, X, Y, p, s, jvp_sample)


class GlobalHypergradient(Algorithm):
    """The aggregated hypergradient of FedOut (Alg. 2, lines 3-6) with a **global** estimate of
    p = [nabla^2_yy g]^{-1} nabla_y f: the estimator named by ``hypergradient_estimator``
    (:mod:`fednest_mpi.algorithms.estimators`; FedIHGP, Alg. 3, by default), for an :class:`Algorithm`
    whose parameters have the estimators' fields and ``hypergradient``. The estimator's state (the
    warm-started v) is checkpointed with the algorithm's."""

    def __init__(self, cfg, problem: BilevelProblem, fed: Federation, seed: int):
        super().__init__(cfg, problem, fed, seed)
        self.estimator = ESTIMATORS[cfg.hypergradient_estimator](self)

    @staticmethod
    def hypergradient_rounds(cfg) -> int:
        """Rounds of :meth:`hypergradient` (its most: randomized FedIHGP and a CG tolerance take fewer)."""
        return ESTIMATORS[cfg.hypergradient_estimator].rounds(cfg) + 1 if cfg.hypergradient == "implicit" else 1

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        return {**super().checkpoint_state(), **self.estimator.state()}

    def restore(self, global_state: dict[str, torch.Tensor], client_states: ClientRows) -> None:
        super().restore(global_state, client_states)
        self.estimator.restore(global_state)

    def fed_ihgp(self, k: int, x, y, S_out: Participants) -> torch.Tensor:
        """p ~ [nabla^2_yy g]^{-1} nabla_y f at (x, y) by the configured estimator; with the default,
        FedIHGP (Alg. 3): p_0 = mean_{S_0} nabla_y f_i (one round), then each of the N (or N') products
        p_n = mean_{S_n} (I - eta nabla^2_yy g_i) p_{n-1} is one round over a fresh client set S_n
        (``ihgp_resample_clients``; otherwise FedOut's set ``S_out``)."""
        return self.estimator.estimate(k, x, y, S_out)

    def hypergradient(self, k: int, x, y, S: Participants) -> torch.Tensor:
        """Aggregated hypergradient estimate of FedOut (Alg. 2, lines 3-6; eqs. (8), (10a)):

        h = mean_S [nabla_x f_i(x, y; xi_i) - nabla^2_xy g_i(x, y; zeta_i) p],  p = the estimator's (FedIHGP).

        Rounds: R (the estimator's; FedIHGP: 1 + N) + 1. With ``hypergradient = "direct"`` (minimax, g_i = -f_i) the
        indirect part vanishes at y*(x) and h = mean_S nabla_x f_i(x, y) (eq. (9), (64)): one round.
        A pooled outer objective f = phi(mean_S u_i) (:meth:`BilevelProblem.outer_statistics`)
        adds one round first, for the mean of the u_i; f_i is then phi's linearisation there.
        """
        prob, rec = self.problem, self.recorder
        for piece in S.chunks(self.fed.chunk_clients):
            ids, n = piece.local_ids, piece.local_ids.size
            rec.took_part(ids, OUTER)
            rec.record("outer_loss", ids, lambda: prob.outer_value(ids, self._rows(x, n), self._rows(y, n)))
        if not prob.pooled_outer_objective:
            return self._hypergradient(k, x, y, S)

        def statistics(piece):
            ids, n = piece.local_ids, piece.local_ids.size
            return [prob.outer_statistics(ids, self._rows(x, n), self._rows(y, n))]

        (pooled,) = self.fed.mean_over(S, statistics)  # one round: the statistics of a pooled f (e.g. group losses)
        with prob.outer_linearised(pooled):
            return self._hypergradient(k, x, y, S)

    def _hypergradient(self, k: int, x, y, S: Participants) -> torch.Tensor:
        """h of :meth:`hypergradient` for the problem's current f_i (the estimator's p, then the direct
        part minus the Jacobian product, one round)."""
        prob, cfg = self.problem, self.cfg
        p = self.fed_ihgp(k, x, y, S) if cfg.hypergradient == "implicit" else None
        factored = p is not None and self.factored("hypergradient_rows")

        def local_hypergradients(piece):
            ids, n = piece.local_ids, piece.local_ids.size
            X, Y = self._rows(x, n), self._rows(y, n)
            s = Sample(self.key(P.OUTER_SAMPLE, k), 0)
            jvp_sample, h_i = Sample(self.key(P.HVP_SAMPLE, k), cfg.neumann_steps + 1), None
            if factored:  # summed by groups:
                h_i = prob.hypergradient_rows(ids, X, Y, self._rows(p, n), s, jvp_sample)  # factored, if it can
            if h_i is None:
                h_i = (
                    prob.grad_x_outer(ids, X, Y, s)
                    if p is None
                    else hypergradient_direction(prob, ids, X, Y, self._rows(p, n), s, jvp_sample)
                )
            self.recorder.record("local_hypergradient_norm", ids, lambda: row_norms(h_i))
            return [h_i]

        client_bytes = prob.factored_rows_bytes() if factored else prob.x_side_bytes()  # None: the default chunks
        (h,) = self.fed.mean_over(S, local_hypergradients, client_bytes=client_bytes)
        return h


class FedNest(InnerLevel, LocalHypergradient, GlobalHypergradient, Algorithm):
    """One outer iteration of Algorithm 1 for any :class:`Variant` (the keyword arguments), with the
    parameters of :class:`~fednest_mpi.config.FedNestConfig`. Carries no state across iterations but
    its estimator's (``warm_start``: v).

    System heterogeneity (:mod:`fednest_mpi.heterogeneity`): every local phase (FedInn / LFedInn's tau,
    FedOut's eq. (7) steps, LFedOut's) runs each client's own number of steps, and every aggregation is
    the plain weighted mean over the members that answered; a round nobody answered keeps the current
    iterate (y, x) or gives a zero vector (q, p's terms, h)."""

    def __init__(self, cfg, problem: BilevelProblem, fed: Federation, seed: int, **variant: bool):
        super().__init__(cfg, problem, fed, seed)
        self.variant = Variant(**variant)
        self.inner_variance_reduction = self.variant.inner_variance_reduction

    @classmethod
    def rounds_per_iteration(cls, cfg, **variant: bool) -> int:
        """Communication rounds of one outer iteration in truncated FedIHGP mode (paper Table 2), or
        with another ``hypergradient_estimator`` its rounds R instead of FedIHGP's 1 + N;
        ``hypergradient = "direct"`` (minimax, eq. (9)) has no estimator: FedOut takes 2 rounds."""
        v = Variant(**variant)
        if not v.alternating:
            return cfg.inner_rounds
        inner = (2 if v.inner_variance_reduction else 1) * cfg.inner_rounds
        if not v.global_outer:
            return inner + 1
        return inner + cls.hypergradient_rounds(cfg) + 1

    # -- Algorithm 1 -----------------------------------------------------------------------------
    def step(self, k: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Outer iteration k: T inner rounds then one outer update; returns (x+, y+, diagnostics)."""
        v, T = self.variant, self.cfg.inner_rounds
        if not v.alternating:
            for t in range(T - 1):
                y = self.fed_inn(k, t, x, y)
            return self.nonalternating_round(k, T - 1, x, y)
        for t in range(T):
            y = self.fed_inn(k, t, x, y)
        if v.global_outer:
            x, diag = self.fed_out(k, x, y)
        else:
            x, diag = self.lfed_out(k, x, y)
        return x, y, diag

    # -- outer level, global (FedOut + the hypergradient of GlobalHypergradient) ----------------
    def fed_out(self, k: int, x, y) -> tuple[torch.Tensor, dict]:
        """FedOut (Alg. 2): x+ = mean_S x_{i,tau}, with the local steps of eq. (7)-(8)

        x_{i,nu+1} = x_{i,nu} - alpha (nabla_x f_i(x_{i,nu}; xi) - nabla_x f_i(x; xi) + h).

        Rounds: N + 2 (:meth:`hypergradient`) + 1 (x). At nu = 0, x_{i,0} = x, so the correction
        is exactly zero and the step is x - alpha h; those two oracle calls are skipped.
        """
        cfg, prob = self.cfg, self.problem
        S = self.sample_clients(P.OUTER_CLIENTS, k)
        h = self.hypergradient(k, x, y, S)

        def local_steps(piece):
            ids, n = piece.local_ids, piece.local_ids.size
            X, Y = self._rows(x, n), self._rows(y, n)
            Xi = self._rows(x - cfg.outer_lr * h, n)  # step 0 is the same for every client: one shared row
            if cfg.outer_local_steps > 1:
                Xi = Xi.contiguous()  # the local steps make the rows differ; the oracles see separate rows
            steps = self.fed.local_steps(ids, k, cfg.outer_local_steps)  # each client's own tau
            for nu in range(1, cfg.outer_local_steps):
                s, a = Sample(self.key(P.OUTER_SAMPLE, k), nu), active_rows(steps, nu)
                if a is not None and not a.size:
                    break
                ia, Xa, Xr, Ya = ids if a is None else ids[a], take_rows(Xi, a), take_rows(X, a), take_rows(Y, a)
                Xa = Xa - cfg.outer_lr * (prob.grad_x_outer(ia, Xa, Ya, s) - prob.grad_x_outer(ia, Xr, Ya, s) + h)
                Xi = put_rows(Xi, a, Xa)
            return [Xi]

        (x_new,) = self.fed.mean_over(S, local_steps, fallback=[x])
        return x_new, {"hypergradient_estimate_norm": float(torch.linalg.vector_norm(h))}

    # -- outer level, local (LFedOut) -----------------------------------------------------------
    def _outer_local(self, ids: np.ndarray, k: int, x, Y) -> torch.Tensor:
        """Local steps of LFedOut (Alg. 5) of the clients ``ids``: every client uses its own Hessian
        and Jacobian (:meth:`local_hypergradient`). ``Y`` holds one y row per client (the global y,
        or the client's own in NonAlt)."""
        Xi = self._rows(x, ids.size)
        rec = self.recorder
        rec.took_part(ids, OUTER)
        rec.record("outer_loss", ids, lambda: self.problem.outer_value(ids, Xi, Y))
        steps = self.fed.local_steps(ids, k, self.cfg.outer_local_steps)  # each client's own tau
        for nu in range(self.cfg.outer_local_steps):
            a = active_rows(steps, nu)
            if a is not None and not a.size:
                break
            h = self.local_hypergradient(k, nu, ids if a is None else ids[a], take_rows(Xi, a), take_rows(Y, a))
            if nu == 0:
                rec.record("local_hypergradient_norm", ids, lambda h=h: row_norms(h))
            Xi = put_rows(Xi, a, take_rows(Xi, a) - self.cfg.outer_lr * h)
        return Xi

    def lfed_out(self, k: int, x, y) -> tuple[torch.Tensor, dict]:
        """LFedOut (Alg. 5): x+ = mean_S x_{i,tau}; one round."""
        S = self.sample_clients(P.OUTER_CLIENTS, k)
        (x_new,) = self.fed.mean_over(
            S,
            lambda piece: [self._outer_local(piece.local_ids, k, x, self._rows(y, piece.local_ids.size))],
            fallback=[x],
        )
        return x_new, {}

    def nonalternating_round(self, k: int, t: int, x, y) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """LFedNest-NonAlt (appendix H.1): one client set trains y locally, then x on its own y_i;
        y and x are averaged together in one fused aggregation (one round)."""
        S = self.sample_clients(P.INNER_CLIENTS, k, t)
        q = self._inner_anchor(S, x, y)

        def local_steps(piece):
            Yi = dense(self._inner_local(piece.local_ids, k, t, x, y, q))
            return [self._outer_local(piece.local_ids, k, x, Yi), Yi]

        x_new, y_new = self.fed.mean_over(S, local_steps, fallback=[x, y])
        return x_new, y_new, {}
