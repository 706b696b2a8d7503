"""Federated bilevel algorithms, written against :mod:`fednest_mpi.federation` and the problem oracles."""

from fednest_mpi.algorithms.fednest import VARIANTS, FedNestFamily, Variant, neumann_series, rounds_per_iteration
from fednest_mpi.algorithms.minimax import FedAvgS

ALGORITHMS = {name: FedNestFamily for name in VARIANTS} | {"fedavg_s": FedAvgS}

__all__ = ["ALGORITHMS", "VARIANTS", "FedAvgS", "FedNestFamily", "Variant", "neumann_series", "rounds_per_iteration"]


def build_algorithm(cfg, problem, fed, seed: int):
    """The algorithm named by ``cfg.name``."""
    return ALGORITHMS[cfg.name](cfg, problem, fed, seed)
