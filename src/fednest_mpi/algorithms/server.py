"""Server optimisers of the outer variable x: FedOpt (Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar &
McMahan, "Adaptive Federated Optimization", ICLR 2021, Algorithm 2) on any algorithm's own update.

The algorithm's step proposes x_{k+1}; the server treats Delta_k = x_k - x_{k+1} as its pseudo-gradient and
moves instead (all operations elementwise):

* ``sgd``:     m <- beta1 m + Delta,                          x <- x_k - eta m      (heavy ball; beta1 = 0: SGD)
* ``adagrad``: v <- v + Delta^2,                               x <- x_k - eta Delta / (sqrt(v) + tau)
* ``adam``:    m <- beta1 m + (1 - beta1) Delta, v <- beta2 v + (1 - beta2) Delta^2,
  x <- x_k - eta m / (sqrt(v) + tau)
* ``yogi``:    as adam with v <- v - (1 - beta2) Delta^2 sign(v - Delta^2)

with m starting at 0 and v at tau^2 (Reddi et al.: v_{-1} >= tau^2; no bias correction, as there). ``none``
(the default) keeps x_{k+1} as the algorithm computed it, bit for bit. The optimiser only transforms x on every
rank alike (replicated tensors, elementwise): no communication round is added, and the results stay
independent of ranks and chunks. Its state (m, v) is checkpointed with the algorithm's
(``server_m``, ``server_v``). No MPI, no HDF5.
"""

from __future__ import annotations

import torch

KINDS = ("none", "sgd", "adam", "yogi", "adagrad")
PREFIX = "server_"  # the names of its state in a checkpoint's algorithm state


class ServerOptimizer:
    """The server optimiser ``kind`` (:data:`KINDS`) with step size ``lr`` and ``beta1``, ``beta2``, ``tau``."""

    def __init__(self, kind: str = "none", lr: float = 1.0, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3):
        if kind not in KINDS:
            raise ValueError(f"server optimiser {kind!r}: one of {', '.join(KINDS)}")
        self.kind, self.lr, self.beta1, self.beta2, self.tau = kind, lr, beta1, beta2, tau
        self.m: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @classmethod
    def of(cls, params) -> ServerOptimizer:
        """The optimiser an algorithm's parameter object configures (``server_optimizer`` and the other
        ``server_*`` fields; a class without them: ``none``)."""
        kind = getattr(params, "server_optimizer", "none")
        if kind == "none":
            return cls()
        return cls(kind, params.server_lr, params.server_beta1, params.server_beta2, params.server_tau)

    def step(self, x: torch.Tensor, proposed: torch.Tensor) -> torch.Tensor:
        """x_{k+1} from x_k and the algorithm's proposal (module docstring)."""
        if self.kind == "none":
            return proposed
        delta = x - proposed
        if self.kind == "sgd":
            self.m = delta if self.m is None else self.beta1 * self.m + delta
            return x - self.lr * self.m
        square = delta * delta
        v = torch.full_like(x, self.tau**2) if self.v is None else self.v
        if self.kind == "adagrad":
            self.v = v + square
            return x - self.lr * delta / (self.v.sqrt() + self.tau)
        m = torch.zeros_like(x) if self.m is None else self.m
        self.m = self.beta1 * m + (1.0 - self.beta1) * delta
        if self.kind == "adam":
            self.v = self.beta2 * v + (1.0 - self.beta2) * square
        else:  # yogi
            self.v = v - (1.0 - self.beta2) * square * torch.sign(v - square)
        return x - self.lr * self.m / (self.v.sqrt() + self.tau)

    def state(self) -> dict[str, torch.Tensor]:
        """Its state that exists, copied: ``server_m``, ``server_v``."""
        return {PREFIX + name: t.clone() for name, t in (("m", self.m), ("v", self.v)) if t is not None}

    def restore(self, saved: dict[str, torch.Tensor]) -> None:
        """Set what :meth:`state` saved (absent entries: not started)."""
        self.m, self.v = saved.get(PREFIX + "m"), saved.get(PREFIX + "v")
