"""SimFBO and ShroFBO (Yang, Xiao & Ji, "SimFBO: Towards Simple, Flexible and Communication-efficient
Federated Bilevel Learning", NeurIPS 2023, arXiv 2305.19442): y, v and x updated together from **one**
round of aggregated local directions, with server-side learning rates.

Round k (the runner's outer iteration), client set S (``clients_per_round``, without replacement), the
global (x, y, v) broadcast; every i in S starts from y_i^0 = y, v_i^0 = v and, for j = 0..tau_i - 1,

    h_y^j = nabla_y g_i(x, y_i^j; zeta_j)
    h_v^j = nabla^2_yy g_i(x, y_i^j; psi_j) v_i^j - nabla_y f_i(x, y_i^j; xi_j)      (grad of 1/2 v'Hv - v'grad_y f)
    h_x^j = nabla_x f_i(x, y_i^j; xi_j) - nabla^2_xy g_i(x, y_i^j; psi_j) v_i^j      (the hypergradient direction)
    y_i^{j+1} = y_i^j - eta_y h_y^j,   v_i^{j+1} = v_i^j - eta_v h_v^j

and sends its local aggregations q_{*,i} = sum_j a_j h_*^j with a_j = 1 (SimFBO's local SGD). The server
aggregates h_* = mean_S q_{*,i} (uniform weights p_i = 1/M, so p~_i = 1/|S|) and updates

    y <- y - gamma_y h_y,   v <- v - gamma_v h_v,   x <- x - gamma_x h_x.

ShroFBO (the paper's system-level-heterogeneity-robust variant) normalises each client's aggregation by
its number of local steps, ||a_i||_1 = tau_i, and rescales by the mean count (FedNova's normalised
averaging, Wang et al. 2020, which the paper builds on): h_* = (mean_S tau_i) mean_S q_{*,i} / tau_i.
With the same tau for every client it is SimFBO (to rounding); with different tau_i SimFBO's h weights
client i by tau_i (it solves the problem with g_i, f_i weighted by tau_i: objective inconsistency),
ShroFBO's does not.

The local step count of each client is a function ``local_steps(k, ids) -> counts`` given to the
constructor; the default is the federation's (:meth:`Federation.local_steps` of ``Params.local_steps``:
the same for everyone unless ``heterogeneity.local_work`` varies it). The counts of S are known on every rank
without communication, so ShroFBO's rescaling needs none; with unavailable clients it averages over the
members that answer (:meth:`Federation.answering`), the ones the round aggregates. A round nobody answers
aggregates zero directions: x, y and v stay.

One round per iteration, of the fused vector (q_y, q_v, q_x): 2 d_y + d_x numbers. v starts at 0 and is
replicated state (checkpointed). Minibatches: zeta_j from (INNER_SAMPLE, k), xi_j from (OUTER_SAMPLE, k),
psi_j from (HVP_SAMPLE, k), step j; the two f gradients of a step share xi_j, the Hessian and Jacobian
products share psi_j.

Read where the paper's text was not available (docs/algorithms.md, "SimFBO"): x stays at the broadcast x
during the local steps (only its direction is aggregated); a_j = 1; no projection of v; ShroFBO's
rescaling by the mean count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fednest_mpi.algorithms.base import Algorithm, State
from fednest_mpi.algorithms.estimators import hypergradient_direction, quadratic_gradient
from fednest_mpi.config import algorithm_params as shared
from fednest_mpi.config import spec
from fednest_mpi.federation import Federation
from fednest_mpi.problems.base import BilevelProblem, Sample
from fednest_mpi.recorder import INNER, OUTER
from fednest_mpi.rng import Purpose as P

#: counts of local steps of the clients ``ids`` in round k: ``local_steps(k, ids) -> int array``
LocalSteps = Callable[[int, np.ndarray], np.ndarray]


def _positive(default: float, text: str):
    return spec(default, text, low=0.0, low_open=True)


@dataclass(frozen=True)
class SimFBOParams:
    """SimFBO (Yang, Xiao & Ji 2023): one round of aggregated local directions of y, v and x per iteration."""

    name: str = spec("simfbo", "algorithm")
    outer_iterations: int = spec(100, "rounds K (one communication round each)", low=1)
    clients_per_round: int = shared._clients_per_round()
    local_steps: int = spec(
        5, "tau: local steps of every client per round (a heterogeneity feature may give each client its own)", low=1
    )
    inner_lr: float = _positive(0.01, "eta_y: local step size of y")
    v_lr: float = _positive(0.01, "eta_v: local step size of v on 1/2 v^T H v - v^T grad_y f")
    server_lr_y: float = _positive(
        0.01, "gamma_y: server step size on the aggregated y direction h_y (= inner_lr: FedAvg's y step)"
    )
    server_lr_v: float = _positive(0.01, "gamma_v: server step size on h_v")
    server_lr_x: float = _positive(0.01, "gamma_x: server step size on the aggregated hypergradient direction h_x")


@dataclass
class VState(State):
    """The global Hessian-inverse-vector state v (None before round 1: v = 0)."""

    v: torch.Tensor | None = None


class SimFBO(Algorithm):
    """SimFBO (module docstring): y, v, x from one round of aggregated local directions, server step sizes."""

    Params = SimFBOParams
    summary = "SimFBO (Yang, Xiao & Ji 2023): y, v and x from one round of aggregated local directions: 1 round"
    kind = "a single-round bilevel method"
    normalised = False  # ShroFBO: each client's aggregation divided by its step count
    varies_local_work = True  # every client runs its own count (heterogeneity.local_work)

    def __init__(self, cfg, problem: BilevelProblem, fed: Federation, seed: int, local_steps: LocalSteps | None = None):
        super().__init__(cfg, problem, fed, seed)
        self.local_steps = local_steps or (lambda k, ids: fed.local_steps(ids, k, cfg.local_steps))
        self.state: VState = VState()

    @classmethod
    def rounds_per_iteration(cls, cfg, **options) -> int:
        """One fused aggregation of (q_y, q_v, q_x)."""
        return 1

    def step(self, k: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        cfg = self.cfg
        v = torch.zeros_like(y) if self.state.v is None else self.state.v
        S = self.sample_clients(P.OUTER_CLIENTS, k)
        counts = np.asarray(self.local_steps(k, S.ids), dtype=np.int64)
        if counts.shape != S.ids.shape or (counts.size and counts.min() < 1):
            raise ValueError(f"local_steps must give every client of the round a count >= 1, got {counts}")

        def rows(piece):
            self.recorder.took_part(piece.local_ids, INNER | OUTER)
            return self.local_directions(k, piece.local_ids, counts[piece.local_slots], x, y, v)

        answered = self.fed.answering(S)  # the members the round aggregates
        h_y, h_v, h_x = self.fed.mean_over(S, rows)
        if self.normalised and answered.any():
            tau = float(counts[answered].mean())
            h_y, h_v, h_x = tau * h_y, tau * h_v, tau * h_x
        self.state.v = v - cfg.server_lr_v * h_v
        x_new, y_new = x - cfg.server_lr_x * h_x, y - cfg.server_lr_y * h_y
        return x_new, y_new, {"hypergradient_estimate_norm": float(torch.linalg.vector_norm(h_x))}

    def local_directions(self, k: int, ids: np.ndarray, counts: np.ndarray, x, y, v) -> list[torch.Tensor]:
        """(q_y, q_v, q_x) rows of the clients ``ids`` after their ``counts`` local steps (ShroFBO: / counts)."""
        cfg, prob, n = self.cfg, self.problem, ids.size
        Y, V = self._rows(y, n), self._rows(v, n)
        Q = [torch.zeros(n, d, dtype=y.dtype, device=y.device) for d in (y.numel(), y.numel(), x.numel())]
        for j in range(int(counts.max()) if n else 0):
            act = np.flatnonzero(counts > j)
            every = act.size == n
            sub = ids if every else ids[act]
            Ys, Vs, Xs = (Y, V, self._rows(x, n)) if every else (Y[act], V[act], self._rows(x, act.size))
            s_out, s_hvp = Sample(self.key(P.OUTER_SAMPLE, k), j), Sample(self.key(P.HVP_SAMPLE, k), j)
            h_y = prob.grad_y_inner(sub, Xs, Ys, Sample(self.key(P.INNER_SAMPLE, k), j))
            h_v = quadratic_gradient(prob, sub, Xs, Ys, Vs, s_hvp, prob.grad_y_outer(sub, Xs, Ys, s_out))
            h_x = hypergradient_direction(prob, sub, Xs, Ys, Vs, s_out, s_hvp)
            if every:
                Y, V = Y - cfg.inner_lr * h_y, V - cfg.v_lr * h_v
                Q = [q + h for q, h in zip(Q, (h_y, h_v, h_x), strict=True)]
            else:
                Y, V = Y.clone(memory_format=torch.contiguous_format), V.clone(memory_format=torch.contiguous_format)
                Y[act], V[act] = Ys - cfg.inner_lr * h_y, Vs - cfg.v_lr * h_v
                idx = torch.as_tensor(act, device=y.device)
                Q = [q.index_add(0, idx, h) for q, h in zip(Q, (h_y, h_v, h_x), strict=True)]
        if self.normalised:
            tau = torch.as_tensor(counts, dtype=y.dtype, device=y.device)[:, None]
            Q = [q / tau for q in Q]
        return Q


@dataclass(frozen=True)
class ShroFBOParams(SimFBOParams):
    """ShroFBO: SimFBO with each client's local directions normalised by its number of local steps."""

    name: str = spec("shrofbo", "algorithm")


class ShroFBO(SimFBO):
    """ShroFBO (module docstring): SimFBO robust to heterogeneous local step counts (normalised aggregation)."""

    Params = ShroFBOParams
    summary = "ShroFBO: SimFBO with each client's directions normalised by its local step count: 1 round"
    normalised = True
