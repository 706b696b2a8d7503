"""FedNest with heavy-ball momentum on x at the server: a plugin algorithm in one file (docs/extending.md).

Per outer iteration: T FedInn rounds on y, then FedOut's hypergradient h (FedIHGP, Alg. 3: N + 2 rounds),
then at the server m <- beta m + h and x <- x - outer_lr m (beta = 0: FedNest with one local step of
FedOut, whose x-averaging round it saves). m lives in the algorithm's State, so checkpoints keep it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fednest_mpi.api import FedNest, FedNestConfig, Purpose, State, spec


@dataclass(frozen=True)
class MomentumParams(FedNestConfig):
    """FedNest's fields and the server momentum."""

    name: str = spec("fednest_momentum", "algorithm")
    server_momentum: float = spec(0.9, "beta: weight of the previous momentum in m <- beta m + h", low=0.0, high=0.999)


@dataclass
class MomentumState(State):
    momentum: torch.Tensor | None = None  # m, replicated; None before the first iteration


class FedNestMomentum(FedNest):
    """FedNest (FedInn SVRG + FedIHGP) with heavy-ball momentum on x at the server."""

    Params = MomentumParams
    kind = "a FedNest variant"
    options = {"inner_variance_reduction": True, "global_outer": True}
    diagnostics = {**FedNest.diagnostics, "momentum_norm": ("||m||, the server momentum after the update", "1")}

    def __init__(self, cfg, problem, fed, seed, **variant):
        super().__init__(cfg, problem, fed, seed, **variant)
        self.state = MomentumState()

    @classmethod
    def rounds_per_iteration(cls, cfg, **variant) -> int:
        """2T (FedInn SVRG) + N + 2 (FedIHGP and the hypergradient); no round for x."""
        return 2 * cfg.inner_rounds + cfg.neumann_steps + 2

    def step(self, k, x, y):
        for t in range(self.cfg.inner_rounds):
            y = self.fed_inn(k, t, x, y)
        h = self.hypergradient(k, x, y, self.sample_clients(Purpose.OUTER_CLIENTS, k))
        m = h if self.state.momentum is None else self.cfg.server_momentum * self.state.momentum + h
        self.state.momentum = m
        diag = {"hypergradient_estimate_norm": float(torch.linalg.vector_norm(h)), "momentum_norm": float(m.norm())}
        return x - self.cfg.outer_lr * m, y, diag
