"""Problems: per-client oracles, no MPI. :func:`build_problem` maps a config to an instance."""

from __future__ import annotations

import torch

from fednest_mpi import config, numerics
from fednest_mpi.problems.base import ORACLES, BilevelProblem
from fednest_mpi.problems.compositional import CompositionalProblem
from fednest_mpi.problems.fairness import FairnessProblem
from fednest_mpi.problems.hyperrep import HyperRepresentationProblem
from fednest_mpi.problems.losstuning import LossTuningProblem
from fednest_mpi.problems.minimax import MinimaxProblem
from fednest_mpi.problems.quadratic import QuadraticProblem
from fednest_mpi.problems.synthetic import SyntheticProblem
from fednest_mpi.registry import import_class

# torch is loaded now: strict MKL before any oracle computes, also when no run is started (numerics)
numerics.prepare_at_import()

__all__ = [
    "ORACLES",
    "BilevelProblem",
    "CompositionalProblem",
    "FairnessProblem",
    "MinimaxProblem",
    "HyperRepresentationProblem",
    "LossTuningProblem",
    "QuadraticProblem",
    "SyntheticProblem",
    "build_problem",
]


def build_problem(
    cfg, seed: int, clients: range, device: str | torch.device = "cpu", dtype=torch.float64
) -> BilevelProblem:
    """The problem named by ``cfg.name`` (its entry in :data:`fednest_mpi.config.PROBLEMS`), hosting the
    client ids in ``clients``."""
    spec = config.PROBLEMS.resolve(cfg.name)
    if spec is None:
        raise config.ConfigError(f"problem.name: unknown problem {cfg.name!r}")
    cls = import_class(spec.implementation)
    return cls.implementation_for(cfg)(cfg, seed, clients, device=device, dtype=dtype)
