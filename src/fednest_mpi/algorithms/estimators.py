"""Federated estimators of p = [nabla^2_yy g(x, y)]^{-1} nabla_y f(x, y), the inverse-Hessian-vector
product of the hypergradient (FedNest eq. (5b), (8)): one option among several, chosen by
``algorithm.hypergradient_estimator`` and shared by every algorithm with a global hypergradient
(FedOut of the FedNest family, :class:`~fednest_mpi.algorithms.fedmbo.FedMBO`).

Each estimator is written once against the two federation primitives (the problem's batched client
oracles and the counted aggregation :meth:`~fednest_mpi.federation.Federation.mean_over`) and sends
one d_y vector per round, so its bytes per call are ``rounds x d_y x 8`` (float64) or ``x 4`` (float32):

=================  =========================================================  =====================
name               estimate (eta = ``neumann_scale``, N = ``neumann_steps``)   rounds per call
=================  =========================================================  =====================
``neumann``        FedIHGP (FedNest Alg. 3): p_0 = mean_S0 nabla_y f_i, then N    1 + N (randomized:
                   global products p_n = mean_Sn (I - eta H_i) p_{n-1}; the       1 + N', N' <= N - 1)
                   truncated sum or the randomized power of eq. (10b)
``local_neumann``  LFedNest's local series (Alg. 5) as an estimate of p: each     1
                   client's own eta sum_{n<=N} (I - eta H_i)^n nabla_y f_i, then
                   p = mean_S0 of them (the mean of local inverses: biased on
                   heterogeneous clients)
``cg``             conjugate gradient on (mean_S0 H_i) p = mean_S0 nabla_y f_i   1 + (iterations <= N)
                   from p = 0: one aggregated Hessian-vector product per
                   iteration; stops after N iterations or once
                   ||r|| <= ``cg_tolerance`` ||r_0|| (or r = 0)
``warm_start``     v carried across outer iterations (0 at the start), improved  1
                   by N local gradient steps on each client's quadratic
                   q_i(v) = 1/2 v^T H_i v - v^T nabla_y f_i,
                   v_i <- v_i - eta (H_i v_i - nabla_y f_i), then v = mean_S0 v_i
=================  =========================================================  =====================

S0 is FedIHGP's first client set (a fresh draw with ``ihgp_resample_clients``, else FedOut's set);
``neumann`` draws a fresh set per product round as Alg. 3 does; ``cg`` keeps S0 for all its products,
because conjugate directions are conjugate for one operator only (a new set per round would change
the matrix under it). With minibatch Hessians (``gradient_noise`` or minibatches) the operator of
``cg`` changes from round to round all the same: CG is then a heuristic, exact only for exact
oracles. The stopping test of ``cg`` reads aggregated (identical on every rank) numbers only, so every
rank stops at the same iteration; under ``reduction = "sum"`` with a positive tolerance a different
rank count may round ||r|| to the other side of the threshold (``ordered``: bitwise the same).

``warm_start`` is the Hessian-inverse-vector state of the single-round methods (SimFBO's v, FedMSA's
v) used inside the FedNest loop; with N = 1 it is one step of gradient descent on the global
quadratic per outer iteration, with N > 1 local steps its fixed point carries the client drift of
local steps (exact when the clients agree). Its v is checkpointed (:meth:`Estimator.state`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from fednest_mpi import rng
from fednest_mpi.federation import Participants
from fednest_mpi.problems.base import Sample
from fednest_mpi.recorder import IHGP

if TYPE_CHECKING:
    from fednest_mpi.algorithms.base import Algorithm

P = rng.Purpose


def neumann_series(step, v: torch.Tensor, n_terms: int, scale: float, mode: str, n_prime=None) -> torch.Tensor:
    """Approximate H^{-1} v with products (I - eta H) r only (eta = ``scale`` ~ 1/l_{g,1}).

    ``mode="truncated"``: eta * sum_{k=0..N} (I - eta H)^k v, error
    ||H^-1 v - p|| <= (1 - eta mu)^{N+1} ||v|| / mu for eta <= 1/L.
    ``mode="randomized"``: N eta (I - eta H)^{N'} v with N' ~ U{0..N-1} (paper eq. (6b)/(10b)),
    whose expectation is the truncated series with N - 1 terms. ``n_prime`` is an int (one N'
    for all rows, FedIHGP) or a ``(B, 1)`` integer tensor (one N' per client row, LFedOut).
    ``step(n, r)`` returns (I - eta H) r for the n-th product (n = 1..); with a per-row ``n_prime``
    it is called as ``step(n, r, rows)`` on the rows ``rows`` that are still multiplying.
    """
    if mode == "truncated":
        p, r = v.clone(), v
        for n in range(1, n_terms + 1):
            r = step(n, r)
            p = p + r
        return scale * p
    if mode != "randomized":
        raise ValueError(f"unknown Neumann mode {mode!r}")
    if n_prime is None:
        raise ValueError("the randomized Neumann series needs its truncation n_prime")
    if not torch.is_tensor(n_prime):
        r = v
        for n in range(1, int(n_prime) + 1):
            r = step(n, r)
        return (n_terms * scale) * r
    # one N' per row: only rows that have not reached their own N' are multiplied (and counted)
    r = v.clone()
    n_prime = n_prime.reshape(-1)
    for n in range(1, int(n_prime.max()) + 1 if n_prime.numel() else 1):
        rows = torch.nonzero(n <= n_prime).reshape(-1)
        r[rows] = step(n, r[rows], rows)
    return (n_terms * scale) * r


def minus_scaled(Hr: torch.Tensor, scale: float, r: torch.Tensor, fresh: bool) -> torch.Tensor:
    """(I - eta H) r as r - eta Hr, bitwise (Hr times -eta, then plus r: two roundings per entry), in Hr's memory
    where the problem's outputs are ``fresh`` (:attr:`BilevelProblem.fresh_outputs`) and Hr is dense, else in a
    new tensor."""
    if fresh and Hr.is_contiguous():
        return Hr.mul_(-scale).add_(r)
    return Hr.mul(-scale).add_(r)


def quadratic_gradient(problem, ids: np.ndarray, X, Y, V, hvp_sample: Sample, grad_f: torch.Tensor) -> torch.Tensor:
    """Each client's gradient of q_i(v) = 1/2 v^T nabla^2_yy g_i v - v^T nabla_y f_i at its row of ``V``:
    nabla^2_yy g_i(X, Y) V - nabla_y f_i (``grad_f``, its rows already evaluated). The minimiser of the
    mean of the q_i is p of the module docstring (SimFBO's and FedMSA's v direction, ``warm_start``)."""
    return problem.hvp_yy_inner(ids, X, Y, V, hvp_sample) - grad_f


def hypergradient_direction(problem, ids: np.ndarray, X, Y, V, outer_sample: Sample, jvp_sample: Sample):
    """Each client's hypergradient direction for a given v row: nabla_x f_i(X, Y) - nabla^2_xy g_i(X, Y) V
    (FedNest eq. (8) with p = V; SimFBO's and FedMSA's x direction); the difference is taken in nabla_x f_i's
    memory where the problem's outputs are fresh (:attr:`BilevelProblem.fresh_outputs`): the same subtraction,
    no temporary of the chunk's rows."""
    grad = problem.grad_x_outer(ids, X, Y, outer_sample)
    jvp = problem.jvp_xy_inner(ids, X, Y, V, jvp_sample)
    if getattr(problem, "fresh_outputs", False) and grad.is_contiguous() and grad.shape == jvp.shape:
        return grad.sub_(jvp)
    return grad - jvp


def local_neumann(alg: Algorithm, k: int, nu: int, ids: np.ndarray, X, Y, v: torch.Tensor) -> torch.Tensor:
    """Each client's own Neumann approximation of [nabla^2_yy g_i(X_i, Y_i)]^{-1} v_i (LFedOut, Alg. 5):
    N = ``neumann_steps`` products with independent minibatches (HVP_SAMPLE, k, nu), step n; with
    ``ihgp_mode = "randomized"`` one N' per client drawn from (IHGP_LENGTH, k, nu, client)."""
    cfg, prob = alg.cfg, alg.problem
    n_prime = None
    if cfg.ihgp_mode == "randomized":
        draws = rng.uniform(alg.key(P.IHGP_LENGTH, k, nu, ids.astype(np.int64)), 1)[:, 0]
        n_prime = torch.as_tensor(np.floor(draws * cfg.neumann_steps).astype(np.int64), device=X.device)[:, None]

    def step(j, r, rows=None):
        sub = slice(None) if rows is None else rows.numpy(force=True)
        return r - cfg.neumann_scale * prob.hvp_yy_inner(
            ids[sub], X[sub], Y[sub], r, Sample(alg.key(P.HVP_SAMPLE, k, nu), j)
        )

    return neumann_series(step, v, cfg.neumann_steps, cfg.neumann_scale, cfg.ihgp_mode, n_prime)


class Estimator(ABC):
    """One way of estimating p for an algorithm ``alg`` whose parameters have ``neumann_steps``,
    ``neumann_scale``, ``ihgp_mode``, ``ihgp_resample_clients`` and ``cg_tolerance``."""

    name: ClassVar[str]

    def __init__(self, alg: Algorithm):
        self.alg = alg

    @classmethod
    @abstractmethod
    def rounds(cls, cfg) -> int:
        """Aggregations of one :meth:`estimate` (the most it can take: ``randomized`` and a ``cg``
        tolerance take fewer), each of one d_y vector."""

    @abstractmethod
    def estimate(self, k: int, x: torch.Tensor, y: torch.Tensor, S: Participants) -> torch.Tensor:
        """p at the global (x, y) of outer iteration k; ``S`` is FedOut's client set. **Collective**."""

    def state(self) -> dict[str, torch.Tensor]:
        """Replicated state carried across iterations (checkpointed with the algorithm's); none by default."""
        return {}

    def restore(self, replicated: dict[str, torch.Tensor]) -> None:  # noqa: B027 -- stateless by default
        """Set what :meth:`state` saved (entries of other owners are ignored)."""

    # -- shared pieces -------------------------------------------------------------------------
    def clients(self, k: int, n: int, S: Participants) -> Participants:
        """The client set of round n of the estimator (FedIHGP's S_n), recorded as IHGP participants."""
        alg = self.alg
        S_n = alg.sample_clients(P.IHGP_CLIENTS, k, n) if alg.cfg.ihgp_resample_clients else S
        alg.recorder.took_part(S_n.local_ids, IHGP)
        return S_n

    def outer_gradient(self, k: int, x, y, S: Participants) -> torch.Tensor:
        """v = mean_S nabla_y f_i(x, y) (one round; the right-hand side of every estimator)."""
        alg = self.alg
        factored = alg.factored("gradient_rows")

        def rows(piece):
            ids, m = piece.local_ids, piece.local_ids.size
            X, Y, sample = alg._rows(x, m), alg._rows(y, m), self.outer_sample(k)
            grad = alg.problem.gradient_rows("grad_y_outer", ids, X, Y, sample) if factored else None
            return [alg.problem.grad_y_outer(ids, X, Y, sample) if grad is None else grad]

        (v,) = alg.mean_y_side(S, rows, factored=factored)
        return v

    def outer_sample(self, k: int) -> Sample:
        return Sample(self.alg.key(P.OUTER_SAMPLE, k), -1)

    def hessian_mean(self, k: int, n: int, x, y, r: torch.Tensor, S: Participants, scale: float | None = None):
        """mean_S nabla^2_yy g_i(x, y) r (one round), or with ``scale`` eta: mean_S (I - eta nabla^2_yy g_i) r."""
        alg = self.alg
        grouped = alg.factored("hvp_rows")

        def rows(piece):
            ids, m = piece.local_ids, piece.local_ids.size
            X, Y, R, sample = alg._rows(x, m), alg._rows(y, m), alg._rows(r, m), Sample(alg.key(P.HVP_SAMPLE, k), n)
            Hr = alg.problem.hvp_rows(ids, X, Y, R, sample) if grouped else None  # factored, or a new tensor
            fresh = Hr is not None or getattr(alg.problem, "fresh_outputs", False)
            if Hr is None:
                Hr = alg.problem.hvp_yy_inner(ids, X, Y, R, sample)
            if scale is None:
                return [Hr]
            return [Hr.plus_scaled(r, -scale) if hasattr(Hr, "plus_scaled") else minus_scaled(Hr, scale, r, fresh)]

        (out,) = alg.mean_y_side(S, rows, factored=grouped)
        return out


class FedIHGP(Estimator):
    """FedIHGP (FedNest Alg. 3): the global Neumann series, one round per product, a fresh client
    set S_n per round (``ihgp_resample_clients``); truncated or randomized (eq. (10b)). The default."""

    name = "neumann"

    @classmethod
    def rounds(cls, cfg) -> int:
        return 1 + cfg.neumann_steps

    def estimate(self, k, x, y, S):
        cfg = self.alg.cfg
        v = self.outer_gradient(k, x, y, self.clients(k, 0, S))

        def step(n, r):
            return self.hessian_mean(k, n, x, y, r, self.clients(k, n, S), scale=cfg.neumann_scale)

        n_prime = (
            rng.integer(self.alg.key(P.IHGP_LENGTH, k), 0, cfg.neumann_steps) if cfg.ihgp_mode == "randomized" else None
        )
        return neumann_series(step, v, cfg.neumann_steps, cfg.neumann_scale, cfg.ihgp_mode, n_prime)


class LocalNeumann(Estimator):
    """LFedNest's local Neumann series (Alg. 5) as an estimate of p: each client of S0 approximates
    [nabla^2_yy g_i]^{-1} nabla_y f_i with its own Hessian alone (:func:`local_neumann`, Neumann step
    index -1), and one round averages them. Converges (N -> infinity) to mean_i H_i^{-1} nabla_y f_i."""

    name = "local_neumann"

    @classmethod
    def rounds(cls, cfg) -> int:
        return 1

    def estimate(self, k, x, y, S):
        alg = self.alg

        def rows(piece):
            ids, m = piece.local_ids, piece.local_ids.size
            X, Y = alg._rows(x, m), alg._rows(y, m)
            return [local_neumann(alg, k, -1, ids, X, Y, alg.problem.grad_y_outer(ids, X, Y, self.outer_sample(k)))]

        (p,) = alg.fed.mean_over(self.clients(k, 0, S), rows)
        return p


class AuthorsNeumann(Estimator):
    """The authors' published FedIHGP (``--hvp_method global_batch``; ``../shared/notes/fednest-reference.md``
    section 1.4), a defect kept as an opt-in so that a run can show how much of their published curves it
    explains (``hypergradient_estimator = "authors_neumann"``; never a default): with v = mean_S0 nabla_y f_i,

        p = eta [v + sum_{k=1..N} (1/k) mean_{i in S0} (I - eta nabla^2_yy g_i)^k v]

    -- each client multiplies v by its **own** (I - eta H_i), and the k-th term is weighted 1/k (their list of
    partial sums is never reset). It is not an estimate of H^{-1} v: for small eta H and N = 5 it is about
    3.3 eta v where the Neumann series of Alg. 3 gives about 6 eta v. Rounds: 2 (v, then the mean of the
    clients' sums; the authors' code counts N + 1, but its N middle rounds carry nothing a client needs)."""

    name = "authors_neumann"

    @classmethod
    def rounds(cls, cfg) -> int:
        return 2

    def estimate(self, k, x, y, S):
        alg, cfg = self.alg, self.alg.cfg
        S0 = self.clients(k, 0, S)
        v = self.outer_gradient(k, x, y, S0)

        def rows(piece):
            ids, m = piece.local_ids, piece.local_ids.size
            X, Y = alg._rows(x, m), alg._rows(y, m)
            r = p = alg._rows(v, m)
            for j in range(1, cfg.neumann_steps + 1):
                r = r - cfg.neumann_scale * alg.problem.hvp_yy_inner(
                    ids, X, Y, r, Sample(alg.key(P.HVP_SAMPLE, k, -1), j)
                )
                p = p + r / j
            return [cfg.neumann_scale * p]

        (p,) = alg.fed.mean_over(S0, rows)
        return p


class ConjugateGradient(Estimator):
    """Conjugate gradient on H p = v with H = mean_S0 nabla^2_yy g_i(x, y), v = mean_S0 nabla_y f_i, from
    p_0 = 0 (Hestenes & Stiefel 1952): one round for v, then one aggregated product H d per iteration,

        alpha = r^T r / d^T H d,  p += alpha d,  r -= alpha H d,  d = r + (r_new^T r_new / r^T r) d,

    at most N = ``neumann_steps`` iterations, fewer once ||r|| <= ``cg_tolerance`` ||r_0|| or r = 0
    (tested before each product, on aggregated numbers: the same on every rank). Exact after d_y
    iterations for exact oracles; ||p - p*||_H <= 2 ((sqrt(kappa) - 1)/(sqrt(kappa) + 1))^n ||p*||_H."""

    name = "cg"

    @classmethod
    def rounds(cls, cfg) -> int:
        return 1 + cfg.neumann_steps

    def estimate(self, k, x, y, S):
        cfg = self.alg.cfg
        S0 = self.clients(k, 0, S)
        r = self.outer_gradient(k, x, y, S0)
        p, d = torch.zeros_like(r), r
        rr = float(r @ r)
        threshold = cfg.cg_tolerance * rr**0.5
        for n in range(1, cfg.neumann_steps + 1):
            if rr == 0.0 or rr**0.5 <= threshold:
                break
            Hd = self.hessian_mean(k, n, x, y, d, S0)
            alpha = rr / float(d @ Hd)
            p, r = p + alpha * d, r - alpha * Hd
            rr, rr_old = float(r @ r), rr
            d = r + (rr / rr_old) * d
        return p


class WarmStart(Estimator):
    """v carried across outer iterations (0 before the first), improved each iteration by N local
    gradient steps of every client of S0 on q_i(v) = 1/2 v^T H_i v - v^T nabla_y f_i
    (:func:`quadratic_gradient`; Hessian minibatch (HVP_SAMPLE, k), step j), averaged in one round."""

    name = "warm_start"
    KEY = "estimator_v"

    def __init__(self, alg: Algorithm):
        super().__init__(alg)
        self.v: torch.Tensor | None = None

    @classmethod
    def rounds(cls, cfg) -> int:
        return 1

    def estimate(self, k, x, y, S):
        alg = self.alg
        eta, start = alg.cfg.neumann_scale, torch.zeros_like(y) if self.v is None else self.v

        def rows(piece):
            ids, m = piece.local_ids, piece.local_ids.size
            X, Y = alg._rows(x, m), alg._rows(y, m)
            b, V = alg.problem.grad_y_outer(ids, X, Y, self.outer_sample(k)), alg._rows(start, m)
            for j in range(1, alg.cfg.neumann_steps + 1):
                V = V - eta * quadratic_gradient(alg.problem, ids, X, Y, V, Sample(alg.key(P.HVP_SAMPLE, k), j), b)
            return [V]

        (self.v,) = alg.mean_y_side(self.clients(k, 0, S), rows)
        return self.v

    def state(self):
        return {} if self.v is None else {self.KEY: self.v.clone()}

    def restore(self, replicated):
        self.v = replicated.get(self.KEY)


#: The estimators by ``algorithm.hypergradient_estimator``; the config field's choices are these names.
ESTIMATORS: dict[str, type[Estimator]] = {
    cls.name: cls for cls in (FedIHGP, LocalNeumann, ConjugateGradient, WarmStart, AuthorsNeumann)
}
