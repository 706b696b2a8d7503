"""Plugins that break their contract on purpose (tests/unit/test_boundary.py): a problem and an algorithm
whose ``fault`` field names the mistake, made on the rank ``fault_rank`` (-1: every rank).

Imported by name (``faulty_plugins:FaultyQuadratic``) from tests/plugins on ``sys.path`` or ``PYTHONPATH``.
"""

import os
from dataclasses import dataclass

import torch
from derived_plugins import LossQuadratic

from fednest_mpi.api import FedNest, FedNestConfig, QuadraticConfig, QuadraticProblem, State, spec

#: faults of the problem after its probe (every oracle called twice at construction)
LATE = ("system_exit", "keyboard_interrupt", "shape_late")


@dataclass(frozen=True)
class FaultyParams(QuadraticConfig):
    name: str = spec("faulty_quadratic", "problem kind")
    fault: str = spec("", "the mistake (tests/plugins/faulty_plugins.py)")
    fault_rank: int = spec(-1, "the rank that makes it (-1: every rank)", low=-1)


class FaultyQuadratic(QuadraticProblem):
    """The quadratic problem, with the public oracle names, and one mistake."""

    Params = FaultyParams

    def __init__(self, cfg, seed, clients, device="cpu", dtype=torch.float64):
        super().__init__(cfg, seed, clients, device=device, dtype=dtype)
        self.calls = 0

    def _faulty(self) -> str:
        from fednest_mpi.comm import world

        rank = world().Get_rank()
        return self.cfg.fault if self.cfg.fault_rank in (-1, rank) else ""

    def grad_x_outer(self, clients, x, y, sample):
        out = self._grad_x_outer_quadratic(clients, x, y, sample)
        self.calls += 1
        fault, late = self._faulty(), self.calls > 2
        if fault == "system_exit" and late:
            raise SystemExit(3)
        if fault == "keyboard_interrupt" and late:
            raise KeyboardInterrupt
        if fault == "shape" or (fault == "shape_late" and late):
            return out[0]
        if fault == "float32":
            return out.float()
        if fault == "random":
            return out + torch.randn(out.shape, dtype=out.dtype)
        if fault == "nan":
            return out * torch.nan
        if fault == "block":  # rows that depend on the block: deterministic, yet not chunk- or rank-invariant
            return out * (1.0 + 0.01 * len(clients))
        return out

    def _grad_x_outer_quadratic(self, clients, x, y, sample):
        return QuadraticProblem._grad_x_outer(self, clients, x, y, sample)

    def evaluate(self, x, y):
        metrics = super().evaluate(x, y)
        if self._faulty() == "metric":
            metrics["surprise"] = 1.0
        return metrics


@dataclass(frozen=True)
class FaultyFedNestParams(FedNestConfig):
    name: str = spec("faulty_fednest", "algorithm")
    fault: str = spec("", "the mistake (tests/plugins/faulty_plugins.py)")
    fault_rank: int = spec(-1, "the rank that makes a fault of step (-1: every rank)", low=-1)
    fault_at: int = spec(1, "the first iteration whose step makes it", low=1)


@dataclass
class CountingState(State):
    steps: int = 0  # not a tensor: checkpoints cannot save it


class FaultyFedNest(FedNest):
    """FedNest with one mistake."""

    Params = FaultyFedNestParams
    options = {"inner_variance_reduction": True, "global_outer": True}

    def __init__(self, cfg, problem, fed, seed, **variant):
        super().__init__(cfg, problem, fed, seed, **variant)
        if cfg.fault == "int_state":
            self.state = CountingState()

    @classmethod
    def rounds_per_iteration(cls, cfg, **variant):
        declared = super().rounds_per_iteration(cfg, **variant)
        return 3 if cfg.fault == "rounds" else declared

    def step(self, k, x, y):
        x, y, diag = super().step(k, x, y)
        if k >= self.cfg.fault_at and self.cfg.fault_rank in (-1, self.fed.rank):
            if self.cfg.fault == "rank_x":  # rank-dependent: this rank's x moves by one part in 2**40
                x = x * (1.0 + 2.0**-40)
            if self.cfg.fault == "os_exit":  # the process ends at once: no exception, no file closed
                os._exit(3)
        if self.cfg.fault == "x_shape":
            return x[:-1], y, diag
        if self.cfg.fault == "not_a_tuple":
            return x
        return x, y, diag


@dataclass(frozen=True)
class RandomLossParams(QuadraticConfig):
    name: str = spec("random_loss", "problem kind")


class RandomLoss(LossQuadratic):
    """The quadratic problem from its losses, with a draw of torch's global generator in the outer loss."""

    Params = RandomLossParams

    def outer_loss(self, x, y, batch):
        return super().outer_loss(x, y, batch) + torch.rand((), dtype=x.dtype)
