"""FedNest with a clipped hypergradient at the server, the tutorial's own algorithm (docs/tutorial.md).

Per outer iteration: T FedInn rounds on y (Alg. 4 with SVRG: 2T rounds), then FedIHGP's hypergradient
estimate h (Alg. 3), then at the server x <- x - outer_lr * min(1, max_norm / ||h||) * h: FedOut with one
local step (tau = 1), its step clipped, and without FedOut's x-averaging round.
"""

from __future__ import annotations

from dataclasses import dataclass

from fednest_mpi.api import FedNest, FedNestConfig, Purpose, spec


@dataclass(frozen=True)
class ClipParams(FedNestConfig):
    """FedNest's fields and the clipping norm."""

    name: str = spec("fednest_clip", "algorithm")
    max_norm: float = spec(1.0, "the server scales the hypergradient h down to at most this norm", low=0.0)


class FedNestClip(FedNest):
    """FedNest (FedInn SVRG + FedIHGP) with the hypergradient clipped at the server."""

    Params = ClipParams
    options = {"inner_variance_reduction": True, "global_outer": True}  # FedNest's constructor switches
    diagnostics = {**FedNest.diagnostics, "clip_factor": ("min(1, max_norm / ||h||): 1 when h was not clipped", "1")}

    @classmethod
    def rounds_per_iteration(cls, cfg, **variant) -> int:
        """2T (FedInn SVRG) + the hypergradient's rounds; no round for x."""
        return 2 * cfg.inner_rounds + cls.hypergradient_rounds(cfg)

    def step(self, k, x, y):
        for t in range(self.cfg.inner_rounds):
            y = self.fed_inn(k, t, x, y)  # FedInn (Alg. 4)
        h = self.hypergradient(k, x, y, self.sample_clients(Purpose.OUTER_CLIENTS, k))  # FedIHGP (Alg. 3)
        norm = float(h.norm())
        factor = min(1.0, self.cfg.max_norm / norm) if norm > 0 else 1.0
        return x - self.cfg.outer_lr * factor * h, y, {"hypergradient_estimate_norm": norm, "clip_factor": factor}
